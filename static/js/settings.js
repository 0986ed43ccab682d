// The workspace settings page: the retention form answers a refusal with 422 and the form again;
// show it (htmx 2 does not swap error responses by default).
(function () {
  "use strict";
  document.addEventListener("htmx:beforeSwap", function (event) {
    var source = event.detail.elt;
    if (event.detail.xhr.status === 422 && source && source.closest && source.closest("#retention")) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
})();
