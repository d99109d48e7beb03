// triogate dashboard: copy buttons, confirmations, and the overview's refresh. No libraries.
"use strict";
document.addEventListener("click", function (event) {
  var button = event.target.closest("[data-copy]");
  if (!button) return;
  var source = document.getElementById(button.getAttribute("data-copy"));
  if (!source) return;
  var done = function () { button.textContent = "Copied"; };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(source.textContent).then(done);
  } else {
    var range = document.createRange();
    range.selectNodeContents(source);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    try { document.execCommand("copy"); done(); } catch (e) { /* selected: copy by hand */ }
  }
});
document.addEventListener("submit", function (event) {
  var question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) event.preventDefault();
});
(function () {
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!seconds) return;
  window.setInterval(function () {
    var active = document.activeElement;
    var typing = active && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
    if (!typing && !document.hidden) window.location.reload();
  }, seconds * 1000);
})();
