// Every console page: an htmx request the server refused with a message meant for the page (a form
// sent with an expired CSRF token, console/pages/errors.py) comes back 4xx with HX-Retarget naming
// where the message goes. htmx 2 drops error answers unless told to swap them, and the click
// seemed to do nothing: swap those. A form's earlier message goes first, so messages never pile up.
(function () {
  "use strict";
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr;
    if (xhr.status < 400 || !xhr.getResponseHeader("HX-Retarget")) return;
    event.detail.shouldSwap = true;
    event.detail.isError = false;
    var earlier = event.detail.target && event.detail.target.previousElementSibling;
    if (earlier && earlier.classList.contains("form-expired")) earlier.remove();
  });
})();
