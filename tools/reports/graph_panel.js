/* qir graph panel: draws the ops of .qg-data, colours them by the chosen overlay, hover, click to the
   node's table rows, search, pan and zoom. Self-contained; one copy serves every panel on the page. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(v) { return typeof v === "number" ? (Math.abs(v) >= 1e-3 || v === 0 ? v.toPrecision(6) : v.toExponential(3)) : String(v); }
  function setup(root) {
    if (root.dataset.ready) return;
    root.dataset.ready = "1";
    var data = JSON.parse(root.querySelector(".qg-data").textContent);
    var svg = root.querySelector("svg.main"), tip = root.querySelector(".tip"), info = root.querySelector(".info");
    var mini = root.querySelector("svg.mini"), frame = null, marks = [];
    var sel = root.querySelector("select.ov"), legend = root.querySelector(".legend"), find = root.querySelector(".find");
    var W = data.box[0], H = data.box[1], groups = [], current = 0, cur = data, blocked = false;
    var view = el("g", {"class": "view"}, svg);
    var vb = {x: 0, y: 0, w: data.width, h: data.height};
    function draw(d) {  /* the ops (data) or the blocks (data.blocks): boxes, edges, the overview's marks */
      cur = d; groups = []; marks = [];
      while (view.firstChild) view.removeChild(view.firstChild);
      while (mini.firstChild) mini.removeChild(mini.firstChild);
      var edgeLayer = el("g", {stroke: "#888", "stroke-width": 1, fill: "none", "stroke-opacity": 0.7}, view);
      d.edges.forEach(function (e) {
        var a = d.nodes[e[0]], b = d.nodes[e[1]], y1 = a[3] + H / 2, y2 = b[3] - H / 2, m = (y1 + y2) / 2;
        el("path", {d: "M" + a[2] + " " + y1 + "C" + a[2] + " " + m + " " + b[2] + " " + m + " " + b[2] + " " + y2}, edgeLayer);
      });
      d.nodes.forEach(function (n, i) {
        var g = el("g", {"class": d === data ? "n" : "n block", "data-node": n[0], "data-i": i,
                         transform: "translate(" + (n[2] - W / 2) + "," + (n[3] - H / 2) + ")"}, view);
        el("rect", {width: W, height: H, rx: d === data ? 4 : 10, stroke: "#555", "stroke-width": d === data ? 1 : 2}, g);
        var t = el("text", {x: W / 2, y: H / 2 + 4, "text-anchor": "middle", "font-size": 10, "font-family": "sans-serif"}, g);
        t.textContent = n[1].length > 18 ? n[1].slice(0, 17) + "\u2026" : n[1];
        groups.push(g);
      });
      /* the overview beside the panel: every node as a mark at its place, the view as a frame; a click there moves the view */
      mini.setAttribute("viewBox", "0 0 " + d.width + " " + d.height);
      mini.setAttribute("preserveAspectRatio", "none");
      d.nodes.forEach(function (n) {
        marks.push(el("rect", {x: n[2] - W / 2, y: n[3] - H / 2, width: W, height: H * 1.6}, mini));
      });
      frame = el("rect", {fill: "none", stroke: "#06c", "stroke-width": 2, "vector-effect": "non-scaling-stroke"}, mini);
    }
    mini.addEventListener("click", function (ev) {
      var r = mini.getBoundingClientRect();
      vb.x = (ev.clientX - r.left) / r.width * cur.width - vb.w / 2;
      vb.y = (ev.clientY - r.top) / r.height * cur.height - vb.h / 2; apply();
    });
    var pick = root.querySelector("select.view");
    if (data.blocks) {
      pick.innerHTML = "<option value='ops'>every op (" + data.nodes.length + ")</option><option value='blocks'>blocks (" +
        data.blocks.nodes.length + "): the worst op of each</option>";
      pick.addEventListener("change", function () { show_view(pick.value === "blocks"); });
    } else {
      pick.style.display = "none";
    }
    function show_view(blocks) {
      blocked = blocks; pick.value = blocks ? "blocks" : "ops";
      draw(blocks ? data.blocks : data); paint(current); start();
    }
    draw(data);
    data.overlays.forEach(function (o, k) {
      var opt = document.createElement("option");
      opt.value = k; opt.textContent = o.name; sel.appendChild(opt);
    });
    function paint(k) {
      current = k;
      var o = cur.overlays[k];
      groups.forEach(function (g, i) {
        g.querySelector("rect").setAttribute("fill", o ? o.colours[i] : "#d9d9d9");
        g.querySelector("text").setAttribute("fill", o && o.t[i] !== null && o.t[i] > 0.6 ? "#fff" : "#000");
        marks[i].setAttribute("fill", o ? o.colours[i] : "#d9d9d9");
        g.setAttribute("data-t", o && o.t[i] !== null ? o.t[i] : "");
        g.setAttribute("data-v", o && o.values[i] !== null ? o.values[i] : "");
      });
      legend.innerHTML = "";
      if (!o) { legend.textContent = "no analysis to colour by"; return; }
      var L = o.legend, span = document.createElement("span");
      if (L.categories) {
        span.innerHTML = L.categories.map(function (c) { return "<span class='sw' style='background:" + c[1] + "'></span> " + c[0]; }).join(" &nbsp; ");
      } else if (L.empty) {
        span.textContent = "no values";
      } else {
        span.innerHTML = (o.label ? o.label + ": " : "") + "best " + fmt(L.best) +
          " <span class='ramp' style='background:linear-gradient(to right," + L.stops.join(",") + ")'></span> worst " + fmt(L.worst) +
          (L.log ? " (log scale of the distance from the best)" : "") + " &nbsp; <span class='sw' style='background:#d9d9d9'></span> no value";
      }
      legend.appendChild(span);
    }
    /* pan and zoom: a viewBox over the drawing */

    function apply() {
      svg.setAttribute("viewBox", vb.x + " " + vb.y + " " + vb.w + " " + vb.h);
      if (frame) { frame.setAttribute("y", vb.y); frame.setAttribute("height", vb.h); frame.setAttribute("x", vb.x); frame.setAttribute("width", vb.w); }
    }
    function show(s) {  /* scale s (pixels per point), the top of the drawing, centred across */
      var r = svg.getBoundingClientRect();
      vb.w = r.width / s; vb.h = r.height / s; vb.x = (cur.width - vb.w) / 2; vb.y = Math.min(0, (cur.height - vb.h) / 2);
      apply();
    }
    function fit() {  /* the whole drawing */
      var r = svg.getBoundingClientRect();
      show(Math.min(r.width / cur.width, r.height / cur.height));
    }
    function start() {  /* readable boxes, as much of the width as fits */
      var r = svg.getBoundingClientRect();
      show(Math.min(1, Math.max(r.width / cur.width, 0.45)));
    }
    function zoom(f, cx, cy) {
      if (cx === undefined) { cx = vb.x + vb.w / 2; cy = vb.y + vb.h / 2; }
      vb.x = cx - (cx - vb.x) * f; vb.y = cy - (cy - vb.y) * f; vb.w *= f; vb.h *= f; apply();
    }
    function centre(i) {
      var n = cur.nodes[i];
      vb.x = n[2] - vb.w / 2; vb.y = n[3] - vb.h / 2; apply();
    }
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var r = svg.getBoundingClientRect();
      zoom(ev.deltaY > 0 ? 1.2 : 1 / 1.2, vb.x + (ev.clientX - r.left) / r.width * vb.w, vb.y + (ev.clientY - r.top) / r.height * vb.h);
    }, {passive: false});
    var drag = null;
    svg.addEventListener("mousedown", function (ev) { drag = {x: ev.clientX, y: ev.clientY, vx: vb.x, vy: vb.y, moved: false}; });
    window.addEventListener("mousemove", function (ev) {
      if (!drag) return;
      var r = svg.getBoundingClientRect(), dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
      vb.x = drag.vx - dx / r.width * vb.w; vb.y = drag.vy - dy / r.height * vb.h; apply();
    });
    window.addEventListener("mouseup", function () { setTimeout(function () { drag = null; }, 0); });
    /* hover */
    view.addEventListener("mousemove", function (ev) {
      var g = ev.target.closest("g.n");
      if (!g) { tip.style.display = "none"; return; }
      var i = +g.getAttribute("data-i"), n = cur.nodes[i], r = root.getBoundingClientRect();
      var rows = cur.overlays.map(function (o) {
        return "<tr><td>" + o.name + "</td><td>" + (o.values[i] === null ? "-" : fmt(o.values[i])) + "</td></tr>";
      }).join("");
      tip.innerHTML = "<b></b><br>" + n[1] + (n[5] ? " &middot; " + n[5] : "") + (n[4].length ? "<br>" + (blocked ? "ops: " : "quantizers: ") + n[4].length : "") +
        (blocked ? "<br>the worst of its ops; click to open it" : "") + "<table>" + rows + "</table>";
      tip.querySelector("b").textContent = n[0];
      tip.style.display = "block";
      tip.style.left = (ev.clientX - r.left + 14) + "px"; tip.style.top = (ev.clientY - r.top + 14) + "px";
    });
    view.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    /* click: the node's rows */
    function rowsOf(i) {
      var n = data.nodes[i], keys = [n[0]].concat(n[4]), found = [];
      document.querySelectorAll("tr[data-node], h3[data-node]").forEach(function (tr) {
        var a = tr.getAttribute("data-node");  /* an op's row, its k-th output's "name[k]", or its quantizers' */
        if (keys.indexOf(a) >= 0 || (a.lastIndexOf(n[0] + "[", 0) === 0 && /^\[\d+\]$/.test(a.slice(n[0].length)))) found.push(tr);
      });
      return found;
    }
    function choose(i) {
      groups.forEach(function (g) { g.classList.remove("sel"); });
      groups[i].classList.add("sel");
      document.querySelectorAll(".qg-row").forEach(function (tr) { tr.classList.remove("qg-row"); });
      var rows = rowsOf(i);  /* table rows, and the headings of its plots */
      rows.forEach(function (tr) {
        tr.classList.add("qg-row");
        for (var d = tr.closest("details"); d; d = d.parentElement && d.parentElement.closest("details")) d.open = true;
      });
      info.textContent = data.nodes[i][0] + ": " + (rows.length ? rows.length + " row(s) highlighted" : "no row in this page's tables");
      if (rows.length) rows[0].scrollIntoView({block: "center"});
      root.setAttribute("data-selected", data.nodes[i][0]);
    }
    view.addEventListener("click", function (ev) {
      if (drag && drag.moved) return;
      var g = ev.target.closest("g.n");
      if (!g) return;
      var i = +g.getAttribute("data-i");
      if (!blocked) { choose(i); return; }
      var members = data.blocks.nodes[i][4], o = data.overlays[current], best = members[0];  /* a block: its worst op */
      members.forEach(function (m) { if (o && o.t[m] !== null && (o.t[best] === null || o.t[m] > o.t[best])) best = m; });
      show_view(false); centre(best); choose(best);
    });
    /* search */
    find.addEventListener("input", function () {
      if (blocked) show_view(false);
      var q = find.value.toLowerCase(), hits = [];
      groups.forEach(function (g, i) {
        var n = data.nodes[i], hit = q.length > 0 && (n[0].toLowerCase().indexOf(q) >= 0 || n[1].toLowerCase() === q);
        g.classList.toggle("hit", hit);
        if (hit) hits.push(i);
      });
      info.textContent = q ? hits.length + " match(es)" : "";
      if (hits.length) centre(hits[0]);
    });
    find.addEventListener("keydown", function (ev) {
      if (ev.key !== "Enter") return;
      var hit = root.querySelector("g.n.hit");
      if (hit) choose(+hit.getAttribute("data-i"));
    });
    root.querySelector(".zin").onclick = function () { zoom(1 / 1.5); };
    root.querySelector(".zout").onclick = function () { zoom(1.5); };
    root.querySelector(".fit").onclick = fit;
    root.querySelector(".worst").onclick = function () {
      if (blocked) show_view(false);
      var o = data.overlays[current], best = -1, bt = -1;
      if (!o) return;
      o.t.forEach(function (t, i) { if (t !== null && t > bt) { bt = t; best = i; } });
      if (best >= 0) { start(); centre(best); choose(best); }
    };
    sel.addEventListener("change", function () { paint(+sel.value); });
    paint(0);
    start();
    root.setAttribute("data-drawn", groups.length);
  }
  function all() { document.querySelectorAll(".qg").forEach(setup); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", all); else all();
})();
