// Every console page: where the keyboard focus goes when a form answers, so a keyboard or screen
// reader user lands on the answer instead of the top of the page.
//
// - A page that comes back with a refused form: its first field marked aria-invalid (the message
//   is its aria-describedby), else an element marked data-takes-focus (a secret shown once, a
//   refusal that belongs to no field).
// - An htmx answer that swapped away the focused button or link (htmx itself keeps an element with
//   an id): in what was swapped in, the first invalid field, else [data-takes-focus], else a
//   message with role=alert, else the swapped region itself.
// - A list's "Next page" link (data-more) that brought its rows in below the others: the first link
//   of the first new row, so the next Tab goes on reading where the list went on, not at its end.
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

  // The rows a "Next page" link brought: those after the last page marker (tr.paged, which every
  // page but the first begins with), the link's own row replaced by them.
  function firstNewRow() {
    var markers = document.querySelectorAll("tr.paged");
    var row = markers.length ? markers[markers.length - 1].nextElementSibling : null;
    return row && !row.classList.contains("more") ? row.querySelector("a[href]") : null;
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
    var trigger = info.requestConfig && info.requestConfig.elt;
    if (trigger && trigger.hasAttribute("data-more")) {
      var first = firstNewRow();
      if (first) { take(first); return; }
    }
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
