//! Inline SVG charts (no scripts, no external assets). Every chart carries
//! `class="chart"`; every text from data goes through [`esc`].

use std::fmt::Write;

use super::html::esc;
use pruefstand_core::util::pct;

/// One row of an interval chart: a label, then (series name, colour, lower, point,
/// upper) per series, and an optional threshold line.
pub(crate) struct IntervalRow {
    pub label: String,
    pub series: Vec<(String, &'static str, f64, f64, f64)>,
    pub threshold: Option<f64>,
}

const LABEL_W: f64 = 200.0;
const PLOT_W: f64 = 420.0;
/// The column right of the plot that holds a bar's figures: wide enough for
/// "100.0 % (2165/2165)" at 10 px.
const VALUE_W: f64 = 120.0;

fn x_of(v: f64) -> f64 {
    LABEL_W + PLOT_W * v.clamp(0.0, 1.0)
}

fn axis(out: &mut String, top: f64, bottom: f64) {
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let x = x_of(tick);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#666">{:.0} %</text>"##,
            bottom + 12.0,
            tick * 100.0
        );
    }
}

/// A dashed threshold mark from `top` to `bottom`, labelled above the plot so it never
/// crosses a figure's text.
fn threshold_mark(out: &mut String, t: f64, top: f64, bottom: f64) {
    let x = x_of(t);
    let _ = write!(
        out,
        r##"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="#000" stroke-dasharray="4 3"><title>threshold {}</title></line>"##,
        pct(t)
    );
}

/// The opening of every chart: an `<svg class="chart">` of the given size (what tests
/// and the report's CSS find), its accessible title and its visible heading.
fn open_chart(id: &str, title: &str, heading: &str, width: f64, height: f64) -> String {
    format!(
        r#"<svg class="chart" id="{}" role="img" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" xmlns="http://www.w3.org/2000/svg"><title>{}</title><text x="0" y="16" font-size="13" font-weight="bold">{}</text>"#,
        esc(id),
        esc(title),
        esc(truncate(heading, 80).as_str())
    )
}

/// A legend in HTML below a chart: it wraps at any width and never clips a long
/// version name, which text inside an SVG of fixed width would.
pub fn legend(items: &[(String, &str)]) -> String {
    let mut out = String::from(r#"<ul class="legend">"#);
    for (name, colour) in items {
        let _ = write!(out, r#"<li><span class="sw" style="background:{}"></span>{}</li>"#, esc(colour), esc(name));
    }
    out.push_str("</ul>");
    out
}

/// Intervals of proportions on a 0–100 % axis, several series per row (e.g. candidate
/// and reference), threshold as a dashed mark; the series are named in a legend.
pub(crate) fn interval_chart(id: &str, title: &str, rows: &[IntervalRow]) -> String {
    let row_h = 18.0;
    let per_row: f64 = rows.iter().map(|r| r.series.len().max(1) as f64 * row_h + 8.0).sum();
    let h = 30.0 + per_row + 20.0;
    let mut out = open_chart(id, title, title, LABEL_W + PLOT_W + 20.0, h);
    axis(&mut out, 24.0, h - 20.0);
    let mut y = 30.0;
    let mut names: Vec<(String, &str)> = Vec::new();
    for row in rows {
        let block = row.series.len().max(1) as f64 * row_h;
        let _ = write!(
            out,
            r#"<text x="0" y="{:.1}" font-size="12">{}</text>"#,
            y + block / 2.0 + 4.0,
            esc(&truncate(&row.label, 30))
        );
        if let Some(t) = row.threshold {
            threshold_mark(&mut out, t, y - 2.0, y + block + 2.0);
        }
        for (i, (name, colour, lo, point, hi)) in row.series.iter().enumerate() {
            if !names.iter().any(|(n, _)| n == name) {
                names.push((name.clone(), colour));
            }
            let cy = y + i as f64 * row_h + row_h / 2.0;
            let _ = write!(
                out,
                r#"<g><title>{}: {} [{}, {}]</title><line x1="{:.1}" y1="{cy:.1}" x2="{:.1}" y2="{cy:.1}" stroke="{colour}" stroke-width="6" stroke-linecap="round" opacity="0.45"/><circle cx="{:.1}" cy="{cy:.1}" r="4" fill="{colour}"/></g>"#,
                esc(name),
                pct(*point),
                pct(*lo),
                pct(*hi),
                x_of(*lo),
                x_of(*hi),
                x_of(*point),
            );
        }
        y += block + 8.0;
    }
    out.push_str("</svg>");
    out + &legend(&names)
}

/// One bar of a bar chart: x of n with its bounds, in a series' colour.
pub struct Bar {
    pub colour: &'static str,
    pub x: u64,
    pub n: u64,
    pub lower: f64,
    pub upper: f64,
}

/// The width of a bar at (or near) 0 %: a tick on the axis, so the bar is seen.
const MIN_BAR_W: f64 = 3.0;

/// One row of a bar chart: a label and one bar per series (candidate, reference).
pub(crate) struct BarRow {
    pub label: String,
    pub bars: Vec<Bar>,
}

/// Horizontal bars of proportions with interval whiskers, their figures in a column of
/// their own right of the plot (so a threshold line never strikes them through);
/// optional threshold line. `series` names the bars' colours in the legend.
pub(crate) fn bar_chart(
    id: &str,
    title: &str,
    rows: &[BarRow],
    series: &[(String, &str)],
    threshold: Option<f64>,
) -> String {
    let bar_h = 12.0;
    let per_row = |r: &BarRow| r.bars.len().max(1) as f64 * bar_h + 6.0;
    let h = 30.0 + rows.iter().map(per_row).sum::<f64>() + 20.0;
    let mut out = open_chart(id, title, title, LABEL_W + PLOT_W + VALUE_W, h);
    axis(&mut out, 24.0, h - 20.0);
    let mut y = 28.0;
    for row in rows {
        let block = per_row(row) - 6.0;
        let _ = write!(
            out,
            r#"<text x="0" y="{:.1}" font-size="11"><title>{}</title>{}</text>"#,
            y + block / 2.0 + 4.0,
            esc(&row.label),
            esc(&truncate(&row.label, 30))
        );
        for (i, bar) in row.bars.iter().enumerate() {
            let by = y + i as f64 * bar_h;
            let rate = if bar.n == 0 { 0.0 } else { bar.x as f64 / bar.n as f64 };
            let cy = by + bar_h / 2.0 - 1.0;
            // A bar at 0 % has no length: its outline and a tick on the axis in its
            // colour still show it is there (the figure beside it says 0.0 %).
            let width = PLOT_W * rate;
            let outline = if width < MIN_BAR_W {
                format!(
                    r##"<rect class="zero" x="{LABEL_W}" y="{by:.1}" width="{MIN_BAR_W}" height="{:.1}" fill="{}" stroke="{}" stroke-width="1"/>"##,
                    bar_h - 2.0,
                    bar.colour,
                    bar.colour
                )
            } else {
                String::new()
            };
            let _ = write!(
                out,
                r##"<g class="bar"><title>{}: {}/{} = {} [{}, {}]</title><rect x="{LABEL_W}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" opacity="0.8"/>{outline}<line x1="{:.1}" y1="{cy:.1}" x2="{:.1}" y2="{cy:.1}" stroke="#000" stroke-width="1.2"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#333">{} ({}/{})</text></g>"##,
                esc(&row.label),
                bar.x,
                bar.n,
                pct(rate),
                pct(bar.lower),
                pct(bar.upper),
                by,
                width,
                bar_h - 2.0,
                bar.colour,
                x_of(bar.lower),
                x_of(bar.upper),
                x_of(bar.lower),
                cy - 3.0,
                x_of(bar.lower),
                cy + 3.0,
                x_of(bar.upper),
                cy - 3.0,
                x_of(bar.upper),
                cy + 3.0,
                LABEL_W + PLOT_W + 8.0,
                by + bar_h - 3.0,
                pct(rate),
                bar.x,
                bar.n
            );
        }
        y += block + 6.0;
    }
    if let Some(t) = threshold {
        threshold_mark(&mut out, t, 24.0, h - 20.0);
    }
    out.push_str("</svg>");
    out + &legend(series)
}

pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max { s.to_string() } else { s.chars().take(max - 1).collect::<String>() + "…" }
}

/// One cell of the heat map: landed, attacked without error, errored, and the case a
/// click opens.
#[derive(Default)]
pub(crate) struct HeatCell {
    pub landed: u64,
    pub n: u64,
    pub errors: u64,
    pub href: Option<String>,
}

/// One block of the heat map: a suite's user tasks (rows) × injection tasks (columns).
pub(crate) struct MatrixBlock {
    pub suite: String,
    pub rows: Vec<String>,
    pub cols: Vec<String>,
    pub cells: std::collections::BTreeMap<(String, String), HeatCell>,
}

/// Red intensity by attack success rate; grey where only errors; blank where not run.
fn heat(rate: f64) -> String {
    let mix = |a: f64, b: f64| (a + (b - a) * rate.clamp(0.0, 1.0)).round() as u8;
    format!("#{:02x}{:02x}{:02x}", mix(232.0, 198.0), mix(245.0, 40.0), mix(233.0, 40.0))
}

const ERROR_GREY: &str = "#9e9e9e";

/// The heat map's key: the colour ramp from 0 % to 100 % landed, and grey for errors.
fn heat_legend(out: &mut String, y: f64) {
    let _ = write!(out, r#"<text x="0" y="{:.1}" font-size="10">injection landed:</text>"#, y + 10.0);
    for (i, rate) in [0.0, 0.25, 0.5, 0.75, 1.0].into_iter().enumerate() {
        let x = 100.0 + i as f64 * 46.0;
        let _ = write!(
            out,
            r##"<rect x="{x:.1}" y="{y:.1}" width="14" height="12" fill="{}" stroke="#ccc"/><text x="{:.1}" y="{:.1}" font-size="10">{:.0} %</text>"##,
            heat(rate),
            x + 17.0,
            y + 10.0,
            rate * 100.0
        );
    }
    let _ = write!(
        out,
        r##"<rect x="340" y="{y:.1}" width="14" height="12" fill="{ERROR_GREY}"/><text x="357" y="{:.1}" font-size="10">errors only</text><text x="430" y="{:.1}" font-size="10">blank: not run · click a cell for its case</text>"##,
        y + 10.0,
        y + 10.0
    );
}

pub(crate) fn heat_map(blocks: &[MatrixBlock]) -> String {
    let cell = 20.0;
    let head = 90.0;
    let width = (LABEL_W + blocks.iter().map(|b| b.cols.len()).max().unwrap_or(0) as f64 * cell + 20.0).max(660.0);
    let height: f64 = 44.0 + blocks.iter().map(|b| head + b.rows.len() as f64 * cell + 14.0).sum::<f64>();
    let mut out = open_chart(
        "matrix",
        "attack success: user task × injection task",
        "Attack success: user task × injection task",
        width,
        height,
    );
    heat_legend(&mut out, 24.0);
    let mut y = 44.0;
    for b in blocks {
        let _ = write!(
            out,
            r#"<text x="0" y="{:.1}" font-size="12" font-weight="bold">{}</text>"#,
            y + head - 4.0,
            esc(&truncate(&b.suite, 30))
        );
        for (j, col) in b.cols.iter().enumerate() {
            let x = LABEL_W + j as f64 * cell + cell / 2.0;
            let _ = write!(
                out,
                r#"<text transform="translate({x:.1},{:.1}) rotate(-60)" font-size="10">{}</text>"#,
                y + head - 4.0,
                esc(&truncate(col, 16))
            );
        }
        y += head;
        for (i, row) in b.rows.iter().enumerate() {
            let ry = y + i as f64 * cell;
            let _ = write!(
                out,
                r#"<text x="0" y="{:.1}" font-size="10">{}</text>"#,
                ry + cell - 6.0,
                esc(&truncate(row, 32))
            );
            for (j, col) in b.cols.iter().enumerate() {
                let Some(c) = b.cells.get(&(row.clone(), col.clone())) else { continue };
                let (fill, text) = if c.n == 0 {
                    (ERROR_GREY.to_string(), format!("{} error(s)", c.errors))
                } else {
                    let errors = if c.errors > 0 { format!(", {} error(s)", c.errors) } else { String::new() };
                    (heat(c.landed as f64 / c.n as f64), format!("{}/{} landed{errors}", c.landed, c.n))
                };
                let rect = format!(
                    r##"<rect x="{:.1}" y="{ry:.1}" width="{cell:.1}" height="{cell:.1}" fill="{fill}" stroke="#fff"><title>{} × {}: {text}</title></rect>"##,
                    LABEL_W + j as f64 * cell,
                    esc(row),
                    esc(col)
                );
                match &c.href {
                    Some(h) => {
                        let _ = write!(out, r#"<a href="{}">{rect}</a>"#, esc(h));
                    }
                    None => out.push_str(&rect),
                }
            }
        }
        y += b.rows.len() as f64 * cell + 14.0;
    }
    out.push_str("</svg>");
    out
}

/// How a line of a time chart tells itself apart beyond its colour: a dash pattern and a
/// marker shape, so lines that coincide (two versions at 0 %) or colours that look alike
/// stay distinguishable, in print and for colour-blind readers too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LineStyle {
    pub dash: &'static str,
    pub marker: Marker,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Marker {
    Circle,
    Square,
    TriangleUp,
    Diamond,
    TriangleDown,
    Cross,
}

const DASHES: [&str; 5] = ["", "7 3", "2 3", "9 3 2 3", "4 4"];
const MARKERS: [Marker; 6] =
    [Marker::Circle, Marker::Square, Marker::TriangleUp, Marker::Diamond, Marker::TriangleDown, Marker::Cross];

impl LineStyle {
    /// The `i`-th style: dashes and markers cycle with different periods, so the first
    /// thirty lines all differ in one or the other.
    pub fn nth(i: usize) -> LineStyle {
        LineStyle { dash: DASHES[i % DASHES.len()], marker: MARKERS[i % MARKERS.len()] }
    }
}

/// A marker of `shape` centred on (cx, cy), about 8 px across.
pub fn marker(shape: Marker, cx: f64, cy: f64, colour: &str) -> String {
    let r = 3.8;
    let poly = |pts: &[(f64, f64)]| {
        let p: Vec<String> = pts.iter().map(|(x, y)| format!("{:.1},{:.1}", cx + x, cy + y)).collect();
        format!(r#"<polygon points="{}" fill="{colour}"/>"#, p.join(" "))
    };
    match shape {
        Marker::Circle => format!(r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="{r}" fill="{colour}"/>"#),
        Marker::Square => format!(
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{colour}"/>"#,
            cx - r * 0.85,
            cy - r * 0.85,
            r * 1.7,
            r * 1.7
        ),
        Marker::TriangleUp => poly(&[(0.0, -r * 1.1), (r, r * 0.8), (-r, r * 0.8)]),
        Marker::TriangleDown => poly(&[(0.0, r * 1.1), (r, -r * 0.8), (-r, -r * 0.8)]),
        Marker::Diamond => poly(&[(0.0, -r * 1.15), (r * 1.15, 0.0), (0.0, r * 1.15), (-r * 1.15, 0.0)]),
        Marker::Cross => format!(
            r#"<path d="M{:.1} {cy:.1}H{:.1}M{cx:.1} {:.1}V{:.1}" stroke="{colour}" stroke-width="2.6"/>"#,
            cx - r,
            cx + r,
            cy - r,
            cy + r
        ),
    }
}

/// A line's key for a legend: a short stretch of the line in its dash pattern with its
/// marker, as a small inline SVG (not a chart).
pub(crate) fn swatch(style: LineStyle, colour: &str) -> String {
    format!(
        r#"<svg class="key" width="30" height="12" viewBox="0 0 30 12" aria-hidden="true"><line x1="0" y1="6" x2="30" y2="6" stroke="{colour}" stroke-width="2" stroke-dasharray="{}"/>{}</svg>"#,
        style.dash,
        marker(style.marker, 15.0, 6.0, colour)
    )
}

/// One point of a time chart: where on the time axis (0–1), the rate with its bounds,
/// the page it links to (an href already made safe, see `safe_href`), and its tooltip.
pub(crate) struct TimePoint {
    pub x: f64,
    pub rate: f64,
    pub lower: f64,
    pub upper: f64,
    pub href: Option<String>,
    pub tip: String,
}

/// One line of a time chart: a version's points, drawn as a line with its bounds as a
/// band, in its colour and style; `class` lets the page hide it (the index's filter).
pub(crate) struct TimeSeries {
    pub name: String,
    pub class: String,
    pub colour: &'static str,
    pub style: LineStyle,
    pub points: Vec<TimePoint>,
}

/// A limit drawn across a chart as a dashed line, with its label right of the plot.
pub struct Threshold {
    pub value: f64,
    pub label: String,
}

/// How far (px) the `i`-th of `n` lines is moved off the axis where its point sits at
/// exactly 0 % or 100 %: there every line would lie on every other. Up to ±6 px, the
/// figure in the tooltip unchanged.
fn edge_offset(i: usize, n: usize, rate: f64) -> f64 {
    if n < 2 || (rate != 0.0 && rate != 1.0) {
        return 0.0;
    }
    let step = (12.0 / (n - 1) as f64).min(3.0);
    -(i as f64 - (n - 1) as f64 / 2.0) * step
}

/// Where a time chart plots: x from 0 to 1 over the plot's width, rates from 0 to 1
/// up its height.
#[derive(Clone, Copy)]
struct Frame {
    left: f64,
    top: f64,
    plot_w: f64,
    plot_h: f64,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        self.left + self.plot_w * x.clamp(0.0, 1.0)
    }

    fn py(&self, v: f64) -> f64 {
        self.top + self.plot_h * (1.0 - v.clamp(0.0, 1.0))
    }
}

/// Rates over time: one line per series with its band of bounds, a labelled time axis
/// (`ticks`: position 0–1 and label), dashed thresholds. A point with an href links to
/// its page; a point's tooltip says what it is.
pub(crate) fn time_chart(
    id: &str,
    title: &str,
    ticks: &[(f64, String)],
    series: &[TimeSeries],
    thresholds: &[Threshold],
) -> String {
    let (w, h, left, right, top, plot_h) = (720.0, 232.0, 46.0, 72.0, 28.0, 170.0);
    let frame = Frame { left, top, plot_w: w - left - right, plot_h };
    let mut out = open_chart(id, title, title, w, h);
    time_axes(&mut out, frame, ticks);
    time_thresholds(&mut out, frame, thresholds);
    // Bands stay faint when many lines share the plot.
    let band_opacity = if series.len() > 2 { 0.07 } else { 0.14 };
    for (i, s) in series.iter().enumerate() {
        time_series(
            &mut out,
            frame,
            s,
            |p: &TimePoint, v: f64| frame.py(v) + edge_offset(i, series.len(), p.rate),
            band_opacity,
        );
    }
    out.push_str("</svg>");
    out
}

/// The rate grid (0–100 %) and the time axis's ticks.
fn time_axes(out: &mut String, f: Frame, ticks: &[(f64, String)]) {
    let Frame { left, top, plot_w, plot_h } = f;
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let y = f.py(tick);
        let _ = write!(
            out,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end" fill="#666">{:.0} %</text>"##,
            left + plot_w,
            left - 4.0,
            y + 3.0,
            tick * 100.0
        );
    }
    for (x, label) in ticks {
        let _ = write!(
            out,
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1:.1}" stroke="#eee"/><text x="{0:.1}" y="{2:.1}" font-size="10" text-anchor="middle" fill="#666">{3}</text>"##,
            f.px(*x),
            top + plot_h + 4.0,
            top + plot_h + 16.0,
            esc(label)
        );
    }
}

/// Thresholds, highest first; a label keeps 11 px from the one above it.
fn time_thresholds(out: &mut String, f: Frame, thresholds: &[Threshold]) {
    let Frame { left, plot_w, .. } = f;
    let mut limits: Vec<&Threshold> = thresholds.iter().collect();
    limits.sort_by(|a, b| b.value.total_cmp(&a.value));
    let mut label_y = f64::NEG_INFINITY;
    for t in limits {
        let y = f.py(t.value);
        label_y = (y + 3.0).max(label_y + 11.0);
        let _ = write!(
            out,
            r##"<g class="threshold"><title>{}</title><line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#000" stroke-dasharray="5 3"/><text x="{:.1}" y="{label_y:.1}" font-size="10">{}</text></g>"##,
            esc(&t.label),
            left + plot_w,
            left + plot_w + 4.0,
            esc(&truncate(&t.label, 12))
        );
    }
}

/// One series: its band and line, and each point with its whisker and tooltip (`y_of`:
/// a point's y, nudged apart from the other series at the edges).
fn time_series(out: &mut String, f: Frame, s: &TimeSeries, y_of: impl Fn(&TimePoint, f64) -> f64, band_opacity: f64) {
    let _ = write!(out, r#"<g class="{}"><title>{}</title>"#, esc(&s.class), esc(&s.name));
    if s.points.len() > 1 {
        let upper: Vec<String> = s.points.iter().map(|p| format!("{:.1},{:.1}", f.px(p.x), f.py(p.upper))).collect();
        let lower: Vec<String> =
            s.points.iter().rev().map(|p| format!("{:.1},{:.1}", f.px(p.x), f.py(p.lower))).collect();
        let line: Vec<String> = s.points.iter().map(|p| format!("{:.1},{:.1}", f.px(p.x), y_of(p, p.rate))).collect();
        let _ = write!(
            out,
            r#"<polygon points="{} {}" fill="{c}" opacity="{band_opacity}"/><polyline fill="none" stroke="{c}" stroke-width="2" stroke-dasharray="{}" points="{}"/>"#,
            upper.join(" "),
            lower.join(" "),
            s.style.dash,
            line.join(" "),
            c = s.colour
        );
    }
    for p in &s.points {
        let (x, y) = (f.px(p.x), y_of(p, p.rate));
        let whisker = format!(
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{c}" opacity="0.5"/>"#,
            f.py(p.upper),
            f.py(p.lower),
            c = s.colour
        );
        // A larger transparent circle makes the point easy to hit.
        let mark = format!(
            r#"<title>{}</title>{}<circle cx="{x:.1}" cy="{y:.1}" r="8" fill="transparent"/>"#,
            esc(&p.tip),
            marker(s.style.marker, x, y, s.colour)
        );
        match &p.href {
            Some(href) => {
                let _ = write!(out, r#"{whisker}<a class="pt" href="{href}">{mark}</a>"#);
            }
            None => {
                let _ = write!(out, r#"{whisker}<g class="pt">{mark}</g>"#);
            }
        }
    }
    out.push_str("</g>");
}

/// A label right of a plot, at the height of what it names.
struct RightLabel {
    y: f64,
    text: String,
}

/// Labels right of a plot, each at its own height unless that is within 11 px of the one
/// above it (then just below that), so no two overlap.
fn right_labels(out: &mut String, x: f64, mut labels: Vec<RightLabel>) {
    labels.sort_by(|a, b| a.y.total_cmp(&b.y));
    let mut last = f64::NEG_INFINITY;
    for l in labels {
        let y = (l.y + 3.0).max(last + 11.0);
        last = y;
        let _ = write!(out, r#"<text x="{x:.1}" y="{y:.1}" font-size="10">{}</text>"#, esc(&l.text));
    }
}

/// A level drawn across a budget chart: a dashed line at `value` (0–1), labelled.
pub(crate) struct Level {
    pub value: f64,
    pub label: String,
    pub dash: &'static str,
}

/// The adaptive attacker's budget curve: the share of `n` pairs broken within k
/// attempts for k = 1..=K (`broken[k - 1]`), drawn as steps over the attempts, each
/// step's count in its tooltip and the last one's beside the line's end; `levels` are
/// dashed lines across (the transfer figure, R2's adaptive maximum), labelled right of
/// the plot.
pub(crate) fn budget_chart(id: &str, title: &str, broken: &[usize], n: usize, levels: &[Level]) -> String {
    let (w, h, left, right, top, plot_h) = (720.0, 238.0, 46.0, 150.0, 28.0, 160.0);
    let frame = Frame { left, top, plot_w: w - left - right, plot_h };
    let k_max = broken.len().max(1);
    let share = |x: usize| if n == 0 { 0.0 } else { x as f64 / n as f64 };
    let px = |k: f64| frame.px(k / k_max as f64);
    let mut out = open_chart(id, title, title, w, h);
    // The share axis, and the attempts below it (at most about ten labels).
    time_axes(&mut out, frame, &[]);
    let every = k_max.div_ceil(10);
    for k in (1..=k_max).filter(|k| k % every == 0 || *k == 1) {
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#666">{k}</text>"##,
            px(k as f64),
            top + plot_h + 14.0
        );
    }
    let _ = write!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#666">attempts per pair (k)</text>"##,
        left + frame.plot_w / 2.0,
        top + plot_h + 30.0
    );
    let mut labels = Vec::new();
    for level in levels {
        let y = frame.py(level.value);
        let _ = write!(
            out,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#000" stroke-dasharray="{}"><title>{}</title></line>"##,
            left + frame.plot_w,
            level.dash,
            esc(&level.label)
        );
        labels.push(RightLabel { y, text: level.label.clone() });
    }
    // Steps: "within k attempts" holds from k - 1 to k.
    let colour = super::colours::CANDIDATE;
    let mut path = format!("M{:.1} {:.1}", px(0.0), frame.py(share(broken.first().copied().unwrap_or(0))));
    for (i, b) in broken.iter().enumerate() {
        let _ = write!(path, "V{:.1}H{:.1}", frame.py(share(*b)), px(i as f64 + 1.0));
    }
    let _ = write!(out, r#"<path d="{path}" fill="none" stroke="{colour}" stroke-width="2.5"/>"#);
    if k_max <= 40 {
        for (i, b) in broken.iter().enumerate() {
            let k = i + 1;
            let _ = write!(
                out,
                r#"<g class="step"><title>within {k} attempt(s): {b}/{n} pairs broken ({})</title>{}</g>"#,
                pct(share(*b)),
                marker(Marker::Circle, px(k as f64), frame.py(share(*b)), colour)
            );
        }
    }
    if let Some(last) = broken.last() {
        labels
            .push(RightLabel { y: frame.py(share(*last)), text: format!("search {last}/{n} ({})", pct(share(*last))) });
    }
    right_labels(&mut out, left + frame.plot_w + 8.0, labels);
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_curve_is_drawn_as_steps_with_its_end_and_levels_labelled() {
        let broken = vec![12, 12, 14, 14, 20];
        let levels = [Level { value: 0.1, label: "transfer 3/30 (10.0 %)".into(), dash: "6 3" }];
        let s = budget_chart("bc", "B", &broken, 30, &levels);
        assert!(s.contains(r#"class="chart""#) && s.contains(r#"<path d="M46.0 "#), "{s}");
        assert_eq!(s.matches(r#"<g class="step">"#).count(), 5, "a point per k");
        assert!(s.contains("within 3 attempt(s): 14/30 pairs broken (46.7 %)"));
        assert!(s.contains(">search 20/30 (66.7 %)<") && s.contains(">transfer 3/30 (10.0 %)<"));
        // Labels that would sit on one height are moved 11 px apart.
        let mut out = String::new();
        let labels = vec![RightLabel { y: 50.0, text: "a".into() }, RightLabel { y: 51.0, text: "b".into() }];
        right_labels(&mut out, 0.0, labels);
        assert!(out.contains(r#"y="53.0""#) && out.contains(r#"y="64.0""#), "{out}");
    }

    #[test]
    fn a_bar_at_zero_is_still_drawn() {
        let bar = Bar { colour: "#123456", x: 0, n: 9, lower: 0.0, upper: 0.3 };
        let s = bar_chart("b", "B", &[BarRow { label: "x".into(), bars: vec![bar] }], &[], None);
        assert!(s.contains(r#"<rect class="zero" x="200" "#) && s.contains(r#"width="3""#), "{s}");
        assert!(s.contains("0.0 % (0/9)"), "its figure beside it");
    }

    #[test]
    fn heat_runs_green_to_red() {
        assert_eq!(heat(0.0), "#e8f5e9");
        assert_eq!(heat(1.0), "#c62828");
    }

    #[test]
    fn time_chart_draws_a_band_per_series_and_labels_the_axis() {
        let point = |x: f64, rate: f64, href: Option<&str>| TimePoint {
            x,
            rate,
            lower: rate / 2.0,
            upper: rate * 1.5,
            href: href.map(str::to_string),
            tip: format!("v1 <{x}>"),
        };
        let s = time_chart(
            "t",
            "T",
            &[(0.0, "12-01 10:00".into()), (1.0, "12-01 12:00".into())],
            &[TimeSeries {
                name: "v1".into(),
                class: "ver-0".into(),
                colour: "#c00",
                style: LineStyle::nth(1),
                points: vec![point(0.0, 0.1, Some("v1/p/r0/report.html")), point(1.0, 0.2, None)],
            }],
            &[Threshold { value: 0.1, label: "R2 ≤ 10 %".into() }],
        );
        assert!(s.contains(r#"class="chart""#) && s.contains("<polyline") && s.contains("<polygon"));
        assert!(s.contains("12-01 12:00") && s.contains(r#"<g class="threshold">"#) && s.contains(">R2 ≤ 10 %<"));
        assert!(s.contains(r#"stroke-dasharray="7 3""#), "the series' dash pattern");
        assert!(s.contains(r#"<g class="ver-0">"#), "the series can be hidden by its class");
        assert_eq!(s.matches(r#"<a class="pt" href="v1/p/r0/report.html">"#).count(), 1, "a point links its report");
        assert!(s.contains("<title>v1 &lt;0&gt;</title>"), "tooltips escaped");
    }

    #[test]
    fn lines_at_zero_are_moved_apart_and_styled_apart() {
        assert_eq!(edge_offset(0, 1, 0.0), 0.0, "a single line stays on the axis");
        let offsets: Vec<f64> = (0..5).map(|i| edge_offset(i, 5, 0.0)).collect();
        assert_eq!(offsets, [6.0, 3.0, 0.0, -3.0, -6.0]);
        assert_eq!(edge_offset(1, 5, 0.3), 0.0, "only at exactly 0 % or 100 %");
        assert!(edge_offset(0, 40, 1.0).abs() <= 6.0);
        let styles: Vec<LineStyle> = (0..30).map(LineStyle::nth).collect();
        for (i, a) in styles.iter().enumerate() {
            assert!(styles[i + 1..].iter().all(|b| b != a), "style {i} repeats");
        }
        for m in MARKERS {
            assert!(marker(m, 10.0, 10.0, "#000").contains(r##""#000""##));
        }
        assert!(swatch(LineStyle::nth(2), "#c00").contains(r#"stroke-dasharray="2 3""#));
    }

    #[test]
    fn bar_figures_sit_right_of_the_plot_so_a_threshold_never_crosses_them() {
        let row =
            BarRow { label: "x".repeat(40), bars: vec![Bar { colour: "#c00", x: 0, n: 4, lower: 0.0, upper: 0.5 }] };
        let s = bar_chart("b", "B", &[row], &[("v".into(), "#c00")], Some(0.1));
        let text_x = LABEL_W + PLOT_W + 8.0;
        assert!(s.contains(&format!(r#"<text x="{text_x:.1}""#)), "{s}");
        assert!(s.contains("0.0 % (0/4)") && s.contains("class=\"legend\""));
        assert!(s.contains(&format!("{}…", "x".repeat(29))), "long labels are shortened, the full one in the title");
    }
}
