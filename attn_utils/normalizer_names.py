"""The names of the normalizers the book compares, importable without torch.

:mod:`attn_utils.book.params` checks the parameter ``normalizers`` against them before anything heavy is imported;
:mod:`attn_utils.mathematics.registry` refuses to import unless they are exactly its records with an envelope and a
Jacobian, in order (adding such a record means adding its name here).
"""
COMPARED: tuple[str, ...] = ("softmax", "sparsemax", "entmax15", "ssmax", "softmax1", "self_adjust",
                             "self_adjust_normalized")
