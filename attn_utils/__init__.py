"""The companion's library: mathematics < models < book < classroom < cli (each layer imports only those below)."""
from attn_utils.startup import defer_iri_grammars

defer_iri_grammars()
