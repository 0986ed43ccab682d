// Every console page: where the keyboard focus goes when a form answers, so a keyboard or screen
// reader user lands on the answer instead of the top of the page.
//
// - A page that comes back with a refused form: its first field marked aria-invalid (the message
//   is its aria-describedby), else an element marked data-takes-focus (a secret shown once, a
//   refusal that belongs to no field).
// - An htmx answer that swapped away the focused button or link (htmx itself keeps an element with
//   an id): in what was swapped in, the first invalid field, else [data-takes-focus], else a
//   message with role=alert, else the swapped region itself.
// A read-only field that takes the focus is selected, ready to copy. live.js's refreshes are not
// requests of the user's: it keeps their focus itself.
(function () {
  "use strict";
  var NATIVE = /^(A|BUTTON|INPUT|SELECT|TEXTAREA|SUMMARY)$/;

  function lost() {
    var active = document.activeElement;
    return !active || active === document.body;
  }

  function take(el) {
    if (!NATIVE.test(el.tagName) && !el.hasAttribute("tabindex")) el.setAttribute("tabindex", "-1");
    el.focus();
    if (el.tagName === "INPUT" && el.readOnly) el.select();
  }

  function answer(root) {
    return root.querySelector('[aria-invalid="true"]:not([disabled])') || root.querySelector("[data-takes-focus]") ||
      root.querySelector('[role="alert"]');
  }

  function onLoad() {
    if (!lost()) return;  // autofocus, or the user was quicker
    var el = document.querySelector('form [aria-invalid="true"]:not([disabled])') ||
      document.querySelector("[data-takes-focus]");
    if (el) take(el);
  }

  var handled = null;
  document.addEventListener("htmx:afterSettle", function (event) {
    var info = event.detail;
    if (!info || !info.xhr || handled === info.xhr) return;  // one answer settles each swapped element
    handled = info.xhr;
    if (!lost()) return;
    var target = info.target;
    if (target && !target.isConnected) target = target.id ? document.getElementById(target.id) : null;
    if (!target) return;
    take(answer(target) || target);
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", onLoad);
  } else {
    onLoad();
  }
})();
