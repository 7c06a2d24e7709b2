// Plinth console: live updates over the console's event stream (server-sent events), parts of a
// page re-fetched when they change (a cluster's rollout), and the BMC power state fetched after
// the page. Hand-written, no libraries; the pages work without it.
(function () {
  "use strict";

  function text(tag, cls, value) {
    var el = document.createElement(tag);
    if (cls) { el.className = cls; }
    el.textContent = value;
    return el;
  }

  function when(iso) {
    var d = new Date(iso);
    if (isNaN(d.getTime())) { return iso; }
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  function item(e) {
    var li = document.createElement("li");
    li.className = "new";
    li.setAttribute("data-kind", e.kind);
    var t = text("time", "", when(e.at));
    t.setAttribute("datetime", e.at);
    li.appendChild(t);
    li.appendChild(document.createTextNode(" "));
    li.appendChild(text("code", "kind", e.kind));
    li.appendChild(document.createTextNode(" "));
    li.appendChild(text("span", "actor", e.actor));
    if (e.machine_id) {
      li.appendChild(document.createTextNode(" "));
      var a = text("a", "", "machine " + String(e.machine_id).slice(0, 8));
      a.href = "/console/machines/" + encodeURIComponent(e.machine_id);
      li.appendChild(a);
    }
    var detail = JSON.stringify(e.detail);
    if (detail && detail.length > 300) { detail = detail.slice(0, 300) + "\u2026"; }
    li.appendChild(document.createTextNode(" "));
    li.appendChild(text("span", "detail", detail || ""));
    return li;
  }

  function follow(list) {
    var url = list.getAttribute("data-live");
    var kinds = (list.getAttribute("data-kinds") || "").split(/\s+/).filter(Boolean);
    var newestFirst = list.getAttribute("data-order") === "newest-first";
    var status = document.querySelector("[data-status-for='" + list.id + "']");
    var say = function (s) { if (status) { status.textContent = s; } };
    if (!window.EventSource) { say("Live updates need a browser with EventSource; reload to see new events."); return; }
    var source = new EventSource(url);
    source.onopen = function () { say("Live: new events appear here."); };
    source.onerror = function () {
      // The server ends the stream when the session signs out or expires; the browser's
      // reconnection then lands on the sign-in page (not a stream) and gives up.
      if (source.readyState === EventSource.CLOSED) {
        say("Live stream ended (signed out, or the session expired): reload the page to sign in again.");
      } else {
        say("Live stream interrupted; reconnecting\u2026");
      }
    };
    source.onmessage = function (msg) {
      var e;
      try { e = JSON.parse(msg.data); } catch (err) { return; }
      document.dispatchEvent(new CustomEvent("plinth:event", { detail: e }));
      if (kinds.length && !kinds.some(function (k) { return e.kind.indexOf(k) === 0; })) { return; }
      var li = item(e);
      if (newestFirst) { list.insertBefore(li, list.firstChild); } else { list.appendChild(li); }
      while (list.children.length > 500) {
        list.removeChild(newestFirst ? list.lastChild : list.firstChild);
      }
    };
  }

  // A part of the page re-fetched from its fragment route (`data-fragment`): when an event
  // arrives (from the page's live list, or from its own `data-stream`), and every 5 s while the
  // part says `data-active` (steps that write no event; a broken stream). A part with
  // `data-follows=ID` is re-fetched when part ID's `data-state` changed (forms are not replaced
  // while nothing changed, so typing is never lost); `data-summary-to=ID` copies the part's
  // `data-summary` into element ID (a live region) when it changed.
  function fragment(el) {
    var url = el.getAttribute("data-fragment");
    var busy = false, again = false, soon = null, poll = null;
    var status = document.querySelector("[data-status-for='" + el.id + "']");
    var say = function (s) { if (status) { status.textContent = s; } };
    var root = function () { return el.firstElementChild; };
    var attr = function (name) { var r = root(); return r ? r.getAttribute(name) : null; };
    function schedule() {
      if (poll) { clearTimeout(poll); poll = null; }
      if (attr("data-active")) { poll = setTimeout(load, 5000); }
    }
    function load() {
      if (busy) { again = true; return; }
      busy = true;
      var before = attr("data-state");
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (r.redirected || !r.ok) { throw new Error(r.redirected ? "signed out" : "HTTP " + r.status); }
          return r.text();
        })
        .then(function (html) {
          el.innerHTML = html;
          var to = el.getAttribute("data-summary-to");
          var target = to && document.getElementById(to);
          var text = attr("data-summary");
          if (target && text && target.textContent !== text) { target.textContent = text; }
          if (attr("data-state") !== before) {
            el.dispatchEvent(new CustomEvent("plinth:changed", { bubbles: true }));
          }
        })
        .catch(function (err) { say("Could not refresh (" + err.message + "); reload the page."); })
        .then(function () {
          busy = false;
          if (again) { again = false; load(); } else { schedule(); }
        });
    }
    function later() { if (!soon) { soon = setTimeout(function () { soon = null; load(); }, 250); } }
    document.addEventListener("plinth:event", later);
    var follows = el.getAttribute("data-follows");
    if (follows) {
      document.addEventListener("plinth:changed", function (ev) {
        var src = ev.target;
        var state = src.firstElementChild && src.firstElementChild.getAttribute("data-state");
        if (src.id === follows && state !== attr("data-state")) { load(); }
      });
    }
    var stream = el.getAttribute("data-stream");
    if (stream && window.EventSource) {
      var source = new EventSource(stream);
      source.onopen = function () { say("Live: changes appear here."); };
      source.onerror = function () {
        say(source.readyState === EventSource.CLOSED
          ? "Live stream ended (signed out, or the session expired): reload the page to sign in again."
          : "Live stream interrupted; reconnecting\u2026");
      };
      source.onmessage = later;
    } else if (stream) {
      say("Live updates need a browser with EventSource; reload to see changes.");
    }
    schedule();
  }

  function power(el) {
    fetch(el.getAttribute("data-power"), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.text(); })
      .then(function (t) { el.textContent = t; })
      .catch(function () { el.textContent = "unknown: the console could not ask"; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-fragment]"), fragment);
    Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), follow);
    Array.prototype.forEach.call(document.querySelectorAll("[data-power]"), power);
  });
})();
