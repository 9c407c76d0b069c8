// tpuwatch status page: fetch the page again every sampling interval and swap <main id="status"> in place,
// so that nothing reloads or flickers; say since when it is stale if the daemon stops answering.
// Served by the daemon itself; the page's Content-Security-Policy allows no other script.
"use strict";
(function () {
  var every = Math.max(2, Number(document.body.dataset.refresh) || 10) * 1000;
  var staleSince = null;
  var busy = false;

  function stale(error) {
    var banner = document.getElementById("stale");
    if (error === null) {
      staleSince = null;
      banner.hidden = true;
      return;
    }
    staleSince = staleSince || new Date();
    banner.textContent = "Not updated since " + staleSince.toLocaleTimeString() + ": " + error +
      ". Showing the last state received.";
    banner.hidden = false;
  }

  function swap(text) {
    var fresh = new DOMParser().parseFromString(text, "text/html");
    var main = fresh.getElementById("status");
    if (!main) {
      throw new Error("the answer is not a status page");
    }
    var open = Array.prototype.map.call(document.querySelectorAll("details[open][id]"), function (d) { return d.id; });
    document.getElementById("status").replaceWith(document.adoptNode(main));
    open.forEach(function (id) {
      var details = document.getElementById(id);
      if (details) { details.open = true; }
    });
    document.title = fresh.title;
  }

  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(window.location.pathname, {cache: "no-store", credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (text) { swap(text); stale(null); })
      .catch(function (error) { stale(error.message || String(error)); })
      .then(function () { busy = false; });
  }

  window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { refresh(); } });
})();
