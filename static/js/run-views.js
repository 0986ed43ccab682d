// The run page's views. They work without it (links and forms); it adds the keys, the copy
// buttons on payloads, and lets htmx swap the forms' 4xx answers (they carry the message).
//
// The "At event N" tab: ← / → step one event back or forward (the links' own requests, so the URL
// keeps ?at=N), anywhere on the page except while typing in a field; the slider keeps the focus
// across the swap so a held arrow key keeps stepping.
(function () {
  "use strict";
  var TYPING = /^(INPUT|TEXTAREA|SELECT)$/;
  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
    if (event.key !== "ArrowLeft" && event.key !== "ArrowRight") return;
    if (!document.getElementById("run-at")) return;
    var target = event.target;
    if (target && target.id !== "scrubber" && (TYPING.test(target.tagName) || target.isContentEditable)) return;
    var link = document.getElementById(event.key === "ArrowLeft" ? "scrub-previous" : "scrub-next");
    event.preventDefault();
    if (link) link.click();
  });
  var keepFocus = false;
  document.addEventListener("htmx:beforeRequest", function () {
    keepFocus = !!document.activeElement && document.activeElement.id === "scrubber";
  });
  document.addEventListener("input", function (event) {
    if (event.target && event.target.id === "scrubber") {
      var output = document.getElementById("scrubber-at");
      if (output) output.firstElementChild.textContent = event.target.value;
    }
  });
  document.addEventListener("htmx:afterSettle", function () {
    var slider = document.getElementById("scrubber");
    if (slider && keepFocus) slider.focus();
    keepFocus = false;
  });

  // The waterfall: a sub-run's bars load once (htmx, hx-trigger="click once"); later clicks
  // fold and unfold them.
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest(".wf-expand");
    if (!button || button.dataset.loaded !== "1") return;
    var rows = document.getElementById(button.getAttribute("aria-controls"));
    var open = button.getAttribute("aria-expanded") === "true";
    button.setAttribute("aria-expanded", open ? "false" : "true");
    if (rows) rows.hidden = open;
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (!target || !target.classList.contains("wf-children")) return;
    var button = document.querySelector('.wf-expand[aria-controls="' + target.id + '"]');
    if (button) { button.dataset.loaded = "1"; button.setAttribute("aria-expanded", "true"); }
  });
  // Escape on an open bar, or anywhere in its detail panel, folds the panel and puts the focus
  // back on the bar (a disclosure's usual keys: Enter / Space open it, Escape leaves it).
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape" || !event.target.closest) return;
    var button = event.target.closest(".wf-bar.wf-expand");
    if (!button) {
      var panel = event.target.closest(".wf-detail");
      button = panel && document.querySelector('.wf-bar.wf-expand[aria-controls="' + panel.id + '"]');
    }
    if (!button || button.getAttribute("aria-expanded") !== "true") return;
    event.preventDefault();
    button.focus();
    button.click();
  });
  // Copy buttons on payloads.
  function fallbackCopy(pre, done) {
    var range = document.createRange();
    range.selectNodeContents(pre);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    try { if (document.execCommand("copy")) done(); } catch (e) { /* selected; the user can copy */ }
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.copy");
    if (!button) return;
    var pre = button.parentElement.querySelector("pre");
    if (!pre) return;
    var done = function () {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(pre.textContent).then(done, function () { fallbackCopy(pre, done); });
    } else {
      fallbackCopy(pre, done);
    }
  });

  // The forms answer a refusal with 400/409/422 and the re-rendered form; show it (htmx 2 does
  // not swap error responses by default). The event's elt is the hx-target, which holds the form:
  // ask the element that made the request.
  var REFUSABLE = "#feedback-form, .reconcile-form, .cancel-form, .share-form";
  document.addEventListener("htmx:beforeSwap", function (event) {
    var status = event.detail.xhr.status;
    var source = event.detail.requestConfig && event.detail.requestConfig.elt;
    var isForm = source && source.closest && source.closest(REFUSABLE);
    if (isForm && (status === 400 || status === 409 || status === 422)) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
})();
