// traind's status page: fetch the page's content again every few seconds and swap it in.
// Without JavaScript the page refreshes itself instead (a <noscript> meta refresh).
"use strict";
(function () {
  var EVERY = 2000;
  var main = document.getElementById("main");
  var timer = null;

  function banner(text) {
    var note = document.getElementById("offline");
    if (!text) { if (note) note.remove(); return; }
    if (!note) {
      note = document.createElement("p");
      note.id = "offline";
      note.className = "bad";
      document.body.insertBefore(note, main);
    }
    note.textContent = text;
  }

  function later() { timer = setTimeout(poll, EVERY); }

  function poll() {
    timer = null;
    if (document.hidden) return;  // picked up again by visibilitychange
    fetch("/?part=main", { cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("traind answered " + r.status);
        return r.text();
      })
      .then(function (html) { main.innerHTML = html; banner(""); })
      .catch(function (e) { banner("traind is not answering (" + e.message + "); retrying"); })
      .then(later);
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && timer === null) poll();
  });
  later();
})();
