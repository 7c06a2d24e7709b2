// Plinth console: live updates over the console's event stream (server-sent events), and the
// BMC power state fetched after the page. Hand-written, no libraries; the pages work without it.
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
      if (kinds.length && !kinds.some(function (k) { return e.kind.indexOf(k) === 0; })) { return; }
      var li = item(e);
      if (newestFirst) { list.insertBefore(li, list.firstChild); } else { list.appendChild(li); }
      while (list.children.length > 500) {
        list.removeChild(newestFirst ? list.lastChild : list.firstChild);
      }
    };
  }

  function power(el) {
    fetch(el.getAttribute("data-power"), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.text(); })
      .then(function (t) { el.textContent = t; })
      .catch(function () { el.textContent = "unknown: the console could not ask"; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), follow);
    Array.prototype.forEach.call(document.querySelectorAll("[data-power]"), power);
  });
})();
