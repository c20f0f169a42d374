// alloctrace report: sortable tables and the timeline's hover readout.
// No external resources; everything here runs on this page's own data.
(function () {
  "use strict";

  function bytes(n) {
    var units = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if (n < 1024) return n + " B";
    var v = n / 1024, u = 0;
    while (v >= 1024 && u + 1 < units.length) { v /= 1024; u++; }
    return (v >= 100 ? v.toFixed(0) : v.toFixed(1)) + " " + units[u];
  }

  // Sortable tables: a click on a header sorts by that column (numbers by
  // their data-v value, text as text); a second click reverses.
  function sortable(table) {
    var heads = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener("click", function () {
        var desc = !th.classList.contains("sorted-desc");
        Array.prototype.forEach.call(heads, function (h) {
          h.classList.remove("sorted-desc", "sorted-asc");
        });
        th.classList.add(desc ? "sorted-desc" : "sorted-asc");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col], y = b.cells[col];
          var vx = x.getAttribute("data-v"), vy = y.getAttribute("data-v");
          var c;
          if (vx !== null && vy !== null) c = Number(vx) - Number(vy);
          else c = x.textContent.localeCompare(y.textContent);
          return desc ? -c : c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), sortable);

  // The timeline's readout: the bucket under the pointer.
  var data = document.getElementById("r-timeline-data");
  var chart = document.getElementById("r-timeline-chart");
  var readout = document.getElementById("r-readout");
  if (data && chart && readout) {
    var d = JSON.parse(data.textContent);
    chart.addEventListener("mousemove", function (e) {
      var box = chart.getBoundingClientRect();
      var scale = box.width / d.width;
      var px = (e.clientX - box.left) / scale;
      var left = d.area[0], right = d.area[1];
      if (px < left || px > right || d.t.length === 0) { readout.style.display = "none"; return; }
      var t = (px - left) / (right - left) * d.x_max;
      var lo = 0, hi = d.t.length - 1;
      while (lo < hi) {
        var mid = (lo + hi + 1) >> 1;
        if (d.t[mid] <= t) lo = mid; else hi = mid - 1;
      }
      readout.textContent = "t = " + d.t[lo].toPrecision(4) + " " + d.unit +
        "\ntotal  " + bytes(d.total[lo]) + "\nheap   " + bytes(d.heap[lo]) +
        "\nspans  " + bytes(d.span[lo]) + "\nlive allocations " + d.objects[lo];
      readout.style.display = "block";
    });
    chart.addEventListener("mouseleave", function () { readout.style.display = "none"; });
  }

  // The page's script ran to its end (the tests look for this).
  document.documentElement.setAttribute("data-report-ready", "yes");
})();
