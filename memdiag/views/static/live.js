// memdiag serve: the page stays open and follows the data.
//
// The server sends an event on /events each time the sink has written (a new snapshot of the
// DuckDB file). The page then fetches its own URL again (?partial=1: its sections as JSON)
// and swaps each section that changed, keeping what the reader did: rows that were open stay
// open, closed ones closed, the scroll position stays on the row that was at the top, each
// table keeps its horizontal scroll, and the filters stay (they are in the URL). Rows that
// were not there before are marked (class "new") for a while. "pause" stops the updates;
// while paused the page says how many are waiting, and resuming applies them at once.
(function () {
  "use strict";
  var status = document.getElementById("live-status");
  var button = document.getElementById("pause");
  if (!status || !button || !window.EventSource) return;
  var paused = false, waiting = 0, seen = null, busy = false, again = false;
  var MARKED = 8000;

  function say(text) { status.textContent = text; }

  function keysOf(root) {
    var keys = new Set();
    root.querySelectorAll("[data-key]").forEach(function (el) { keys.add(el.dataset.key); });
    return keys;
  }

  function anchorOf() {
    // the first keyed row at or below the top of the window: it stays where it is
    var rows = document.querySelectorAll("main [data-key], section [data-key]");
    for (var i = 0; i < rows.length; i++) {
      var top = rows[i].getBoundingClientRect().top;
      if (top >= 0) return { key: rows[i].dataset.key, top: top };
    }
    return null;
  }

  function swap(section, html) {
    var body = section.querySelector(".body");
    if (!body || body.dataset.html === html) return false;
    var known = keysOf(body);
    var open = new Set(), shut = new Set();
    body.querySelectorAll("details[data-key]").forEach(function (d) {
      (d.open ? open : shut).add(d.dataset.key);
    });
    var scrolls = Array.prototype.map.call(body.querySelectorAll(".scroll"), function (s) {
      return s.scrollLeft;
    });
    var template = document.createElement("template");
    template.innerHTML = html;  // the server's own, escaped HTML; templates run no script
    body.replaceChildren(template.content);
    body.dataset.html = html;
    body.querySelectorAll("details[data-key]").forEach(function (d) {
      if (open.has(d.dataset.key)) d.open = true;
      if (shut.has(d.dataset.key)) d.open = false;
    });
    body.querySelectorAll(".scroll").forEach(function (s, i) {
      if (i < scrolls.length) s.scrollLeft = scrolls[i];
    });
    var fresh = [];
    body.querySelectorAll("tr[data-key], li[data-key], details[data-key], .tile[data-key]")
      .forEach(function (el) { if (!known.has(el.dataset.key)) fresh.push(el); });
    if (known.size) {  // a section that was empty marks nothing: all of it is new
      fresh.forEach(function (el) { el.classList.add("new"); });
      setTimeout(function () { fresh.forEach(function (el) { el.classList.remove("new"); }); },
                 MARKED);
    }
    return true;
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    var url = new URL(window.location.href);
    url.searchParams.set("partial", "1");
    var anchor = anchorOf();
    fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (page) {
        if (paused) {  // paused while it was on its way: it waits like the others
          waiting++;
          say("paused · " + waiting + " update" + (waiting === 1 ? "" : "s") + " waiting");
          return;
        }
        var have = Array.prototype.map.call(document.querySelectorAll("section[id]"),
                                            function (s) { return s.id; }).sort().join(" ");
        if (Object.keys(page.sections).sort().join(" ") !== have) {
          window.location.reload();  // the page changed shape (an error page, new sections)
          return;
        }
        var changed = 0;
        Object.keys(page.sections).forEach(function (id) {
          var section = document.getElementById(id);
          if (section && swap(section, page.sections[id])) changed++;
        });
        var meta = document.querySelector("p.meta .page-meta");
        if (meta && page.meta !== undefined) meta.innerHTML = page.meta;
        // browsers with scroll anchoring (Chromium, Firefox) keep the place themselves: then
        // this moves nothing; others (Safari) are kept on the row that was at the top
        if (anchor) {
          var el = document.querySelector('[data-key="' + CSS.escape(anchor.key) + '"]');
          if (el) window.scrollBy(0, el.getBoundingClientRect().top - anchor.top);
        }
        say("live · updated " + new Date().toLocaleTimeString() + (changed ? "" : " (no change)"));
      })
      .catch(function (err) {
        say("live · update failed (" + err.message + "), retrying");
        setTimeout(function () { if (!paused) refresh(); }, 2000);
      })
      .then(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }

  button.addEventListener("click", function () {
    paused = !paused;
    button.setAttribute("aria-pressed", paused ? "true" : "false");
    button.textContent = paused ? "resume" : "pause";
    if (paused) {
      say("paused");
    } else if (waiting) {
      waiting = 0;
      refresh();
    } else {
      say("live");
    }
  });

  document.querySelectorAll("section > .body").forEach(function (body) {
    body.dataset.html = body.innerHTML;
  });

  var events = new EventSource("/events");
  events.addEventListener("update", function (ev) {
    var version = JSON.parse(ev.data).version;
    if (seen === null) {  // the version this page was made from
      seen = Number(status.dataset.version);
    }
    if (version === seen) return;
    seen = version;
    if (paused) {
      waiting++;
      say("paused · " + waiting + " update" + (waiting === 1 ? "" : "s") + " waiting");
      return;
    }
    refresh();
  });
  events.addEventListener("error", function () {
    if (!paused) say("live · reconnecting");
  });
})();
