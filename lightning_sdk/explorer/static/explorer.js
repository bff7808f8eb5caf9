// The run explorer's only script: draws the Run page's curves as inline SVG and, on the live page, polls
// /api/metrics so that a step the trainer just logged appears without a reload.
// Recorded text never passes through here as markup: every label is set with textContent.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = ["#2563eb", "#f59e0b", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#be185d"];
  const W = 560, H = 240, LEFT = 48, RIGHT = 12, TOP = 12, BOTTOM = 28;

  function node(name, attributes, parent) {
    const element = document.createElementNS(SVG, name);
    for (const key in attributes) element.setAttribute(key, String(attributes[key]));
    if (parent) parent.appendChild(element);
    return element;
  }

  function text(parent, x, y, value, anchor) {
    const label = node("text", { x: x, y: y, "text-anchor": anchor || "middle", class: "axis" }, parent);
    label.textContent = value;
    return label;
  }

  function bounds(series) {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const one of series) {
      for (const [x, y] of one.points) {
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }
    }
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
    const pad = (y1 - y0) * 0.05;
    return [x0, x1, y0 - pad, y1 + pad];
  }

  function draw(figure, chart) {
    while (figure.firstChild) figure.removeChild(figure.firstChild);
    const caption = document.createElement("figcaption");
    caption.textContent = chart.title;
    figure.appendChild(caption);
    const svg = node("svg", { viewBox: "0 0 " + W + " " + H, role: "img" }, figure);
    const [x0, x1, y0, y1] = bounds(chart.series);
    const sx = (x) => LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    const sy = (y) => TOP + (1 - (y - y0) / (y1 - y0)) * (H - TOP - BOTTOM);
    for (let i = 0; i <= 4; i++) {
      const value = y0 + (y1 - y0) * i / 4;
      node("line", { x1: LEFT, x2: W - RIGHT, y1: sy(value), y2: sy(value), class: "grid" }, svg);
      text(svg, LEFT - 4, sy(value) + 4, value.toFixed(2), "end");
    }
    text(svg, LEFT, H - 8, "step " + x0, "start");
    text(svg, W - RIGHT, H - 8, "step " + x1, "end");
    const legend = document.createElement("ul");
    legend.className = "legend";
    chart.series.forEach(function (one, index) {
      const colour = COLOURS[index % COLOURS.length];
      if (one.points.length) {
        const path = one.points.map(([x, y], k) => (k ? "L" : "M") + sx(x).toFixed(1) + " " + sy(y).toFixed(1));
        node("path", { d: path.join(" "), stroke: colour, class: "series" }, svg);
        for (const [x, y] of one.points) {
          const dot = node("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: colour, "data-step": x, "data-series": index }, svg);
          node("title", {}, dot).textContent = one.name + " at step " + x + ": " + y.toFixed(3);
        }
      }
      const item = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = colour;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(one.name));
      legend.appendChild(item);
    });
    figure.appendChild(legend);
  }

  function render(container, charts) {
    const seen = new Set();
    for (const chart of charts) {
      seen.add(chart.id);
      let figure = container.querySelector('figure[data-chart="' + chart.id + '"]');
      if (!figure) {
        figure = document.createElement("figure");
        figure.className = "chart";
        figure.setAttribute("data-chart", chart.id);
        container.appendChild(figure);
      }
      draw(figure, chart);
    }
    for (const figure of Array.from(container.querySelectorAll("figure[data-chart]"))) {
      if (!seen.has(figure.getAttribute("data-chart"))) figure.remove();
    }
  }

  // The Run page's table of steps, rebuilt from the poll's rows (numbers and our own short strings).
  function steps(rows) {
    const table = document.querySelector("table.steps");
    if (!table) return;
    const body = table.querySelector("tbody");
    while (body.firstChild) body.removeChild(body.firstChild);
    for (const row of rows) {
      const line = document.createElement("tr");
      const first = document.createElement("td");
      const link = document.createElement("a");
      link.className = "step-link";
      link.href = "step/" + String(Number(row.step));  // relative: the Run page is the explorer's root
      link.textContent = "step " + String(Number(row.step));
      first.appendChild(link);
      line.appendChild(first);
      for (const key of ["reward", "signal", "episodes", "seconds"]) {
        const cell = document.createElement("td");
        cell.textContent = String(row[key]);
        line.appendChild(cell);
      }
      body.appendChild(line);
    }
    table.hidden = rows.length === 0;
    const empty = document.getElementById("no-steps");
    if (empty) empty.hidden = rows.length > 0;
  }

  // The Run page's line about live updates: shown with a text, hidden with "".
  function notice(text) {
    const line = document.getElementById("poll-problem");
    if (!line) return;
    line.textContent = text;
    line.hidden = text === "";
  }

  function poll(container) {
    const url = container.getAttribute("data-poll");
    let count = Number(container.getAttribute("data-count"));
    async function once() {
      try {
        const reply = await fetch(url + "?known=" + count, { cache: "no-store", credentials: "same-origin" });
        if (reply.status === 401) {
          // The key's cookie is gone (another explorer on this host, or it expired): say so and stop.
          notice("Live updates stopped: this page no longer has the explorer's key. Open the address the " +
            "command printed (it ends in ?key=...) again.");
          return;
        }
        notice(reply.ok ? "" : "Lost contact with the explorer (it answered " + reply.status + "); retrying.");
        if (reply.ok) {
          const body = await reply.json();
          if (body.charts) {
            count = body.count;
            render(container, body.charts);
            const last = document.getElementById("last-step");
            if (last && body.last_step !== null) last.textContent = String(body.last_step);
            const lines = document.getElementById("record-count");
            if (lines) lines.textContent = String(body.count);
            if (body.steps) steps(body.steps);
          }
        }
      } catch (error) {
        // The server stopped (the run ended, or the viewer was closed): keep what is drawn, say so, retry.
        notice("Lost contact with the explorer: it stopped, or the network did. What is drawn stays; " +
          "retrying every 2 s.");
      }
      setTimeout(once, 2000);
    }
    setTimeout(once, 2000);
  }

  function start() {
    for (const data of document.querySelectorAll("script[type='application/json'][data-charts-for], #charts-data")) {
      const target = data.getAttribute("data-charts-for");
      const container = target ? document.getElementById(target) : document.getElementById("charts");
      if (!container) continue;
      render(container, JSON.parse(data.textContent));
      if (container.getAttribute("data-poll")) poll(container);
    }
    // The one-file snapshot: each view is a section; the address's #name picks the one shown.
    const sections = document.querySelectorAll("section.view");
    if (sections.length) {
      const show = function () {
        const name = (location.hash || "#run").slice(1);
        let shown = false;
        for (const section of sections) {
          const match = section.id === name;
          section.hidden = !match;
          shown = shown || match;
        }
        if (!shown) sections[0].hidden = false;
        window.scrollTo(0, 0);
      };
      window.addEventListener("hashchange", show);
      show();
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
