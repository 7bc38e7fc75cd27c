// A click on a figure opens the image at full size: every image of the text is wrapped in a link to itself.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll(".bd-article figure img, .bd-article .cell_output img").forEach((img) => {
    if (img.closest("a")) return;
    const link = document.createElement("a");
    link.href = img.currentSrc || img.src;
    link.className = "full-size";
    link.title = "Open the figure at full size";
    img.parentNode.insertBefore(link, img);
    link.appendChild(img);
  });
});
