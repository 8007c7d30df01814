//! Inline SVG charts (no scripts, no external assets). Every chart carries
//! `class="chart"`; every text from data goes through [`esc`].

use std::fmt::Write;

/// HTML/XML escaping for text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub fn pct(p: f64) -> String {
    format!("{:.1} %", 100.0 * p)
}

/// One row of an interval chart: a label, then (series name, colour, lower, point,
/// upper) per series, and an optional threshold line.
pub struct IntervalRow {
    pub label: String,
    pub series: Vec<(String, &'static str, f64, f64, f64)>,
    pub threshold: Option<f64>,
}

const LABEL_W: f64 = 200.0;
const PLOT_W: f64 = 420.0;

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

/// The opening of every chart: an `<svg class="chart">` of the given size (what tests
/// and the report's CSS find), its accessible title and its visible heading.
fn open_chart(id: &str, title: &str, heading: &str, width: f64, height: f64) -> String {
    format!(
        r#"<svg class="chart" id="{}" role="img" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" xmlns="http://www.w3.org/2000/svg"><title>{}</title><text x="0" y="16" font-size="13" font-weight="bold">{}</text>"#,
        esc(id),
        esc(title),
        esc(heading)
    )
}

/// Intervals of proportions on a 0–100 % axis, several series per row (e.g. candidate
/// and reference), threshold as a dashed mark.
pub fn interval_chart(id: &str, title: &str, rows: &[IntervalRow]) -> String {
    let row_h = 18.0;
    let per_row: f64 = rows.iter().map(|r| r.series.len().max(1) as f64 * row_h + 8.0).sum();
    let h = 30.0 + per_row + 20.0;
    let mut out = open_chart(id, title, title, LABEL_W + PLOT_W + 90.0, h);
    axis(&mut out, 24.0, h - 20.0);
    let mut y = 30.0;
    for row in rows {
        let block = row.series.len().max(1) as f64 * row_h;
        let _ =
            write!(out, r#"<text x="0" y="{:.1}" font-size="12">{}</text>"#, y + block / 2.0 + 4.0, esc(&row.label));
        if let Some(t) = row.threshold {
            let x = x_of(t);
            let _ = write!(
                out,
                r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#000" stroke-dasharray="4 3"><title>threshold {}</title></line>"##,
                y - 2.0,
                y + block + 2.0,
                pct(t)
            );
        }
        for (i, (name, colour, lo, point, hi)) in row.series.iter().enumerate() {
            let cy = y + i as f64 * row_h + row_h / 2.0;
            let _ = write!(
                out,
                r#"<g><title>{}: {} [{}, {}]</title><line x1="{:.1}" y1="{cy:.1}" x2="{:.1}" y2="{cy:.1}" stroke="{colour}" stroke-width="6" stroke-linecap="round" opacity="0.45"/><circle cx="{:.1}" cy="{cy:.1}" r="4" fill="{colour}"/><text x="{:.1}" y="{:.1}" font-size="10" fill="{colour}">{}</text></g>"#,
                esc(name),
                pct(*point),
                pct(*lo),
                pct(*hi),
                x_of(*lo),
                x_of(*hi),
                x_of(*point),
                LABEL_W + PLOT_W + 8.0,
                cy + 4.0,
                esc(name)
            );
        }
        y += block + 8.0;
    }
    out.push_str("</svg>");
    out
}

/// Horizontal bars of proportions with their counts; optional threshold line.
pub fn bar_chart(id: &str, title: &str, rows: &[(String, u64, u64)], threshold: Option<f64>) -> String {
    let row_h = 16.0;
    let h = 30.0 + rows.len() as f64 * row_h + 20.0;
    let mut out = open_chart(id, title, title, LABEL_W + PLOT_W + 90.0, h);
    axis(&mut out, 24.0, h - 20.0);
    for (i, (label, x, n)) in rows.iter().enumerate() {
        let y = 28.0 + i as f64 * row_h;
        let rate = if *n == 0 { 0.0 } else { *x as f64 / *n as f64 };
        let _ = write!(
            out,
            r##"<g><title>{}: {x}/{n} = {}</title><text x="0" y="{:.1}" font-size="11">{}</text><rect x="{LABEL_W}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#c62828"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#333">{} ({x}/{n})</text></g>"##,
            esc(label),
            pct(rate),
            y + 11.0,
            esc(&truncate(label, 32)),
            y + 2.0,
            PLOT_W * rate,
            row_h - 4.0,
            LABEL_W + PLOT_W * rate + 4.0,
            y + 11.0,
            pct(rate)
        );
    }
    if let Some(t) = threshold {
        let x = x_of(t);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="24" x2="{x:.1}" y2="{:.1}" stroke="#000" stroke-dasharray="4 3"/>"##,
            h - 20.0
        );
    }
    out.push_str("</svg>");
    out
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max { s.to_string() } else { s.chars().take(max - 1).collect::<String>() + "…" }
}

/// One block of the heat map: a suite's user tasks (rows) × injection tasks (columns);
/// cell = (landed, attacked without error, errored).
pub struct MatrixBlock {
    pub suite: String,
    pub rows: Vec<String>,
    pub cols: Vec<String>,
    pub cells: std::collections::BTreeMap<(String, String), (u64, u64, u64)>,
}

/// Red intensity by attack success rate; grey where only errors; blank where not run.
fn heat(rate: f64) -> String {
    let mix = |a: f64, b: f64| (a + (b - a) * rate.clamp(0.0, 1.0)).round() as u8;
    format!("#{:02x}{:02x}{:02x}", mix(232.0, 198.0), mix(245.0, 40.0), mix(233.0, 40.0))
}

pub fn heat_map(blocks: &[MatrixBlock]) -> String {
    let cell = 16.0;
    let head = 90.0;
    let width = LABEL_W + blocks.iter().map(|b| b.cols.len()).max().unwrap_or(0) as f64 * cell + 100.0;
    let height: f64 = 24.0 + blocks.iter().map(|b| head + b.rows.len() as f64 * cell + 14.0).sum::<f64>();
    let mut out = open_chart(
        "matrix",
        "attack success: user task × injection task",
        "Attack success: user task × injection task",
        width,
        height,
    );
    let mut y = 24.0;
    for b in blocks {
        let _ = write!(
            out,
            r#"<text x="0" y="{:.1}" font-size="12" font-weight="bold">{}</text>"#,
            y + head - 4.0,
            esc(&b.suite)
        );
        for (j, col) in b.cols.iter().enumerate() {
            let x = LABEL_W + j as f64 * cell + cell / 2.0;
            let _ = write!(
                out,
                r#"<text transform="translate({x:.1},{:.1}) rotate(-60)" font-size="10">{}</text>"#,
                y + head - 4.0,
                esc(&truncate(col, 18))
            );
        }
        y += head;
        for (i, row) in b.rows.iter().enumerate() {
            let ry = y + i as f64 * cell;
            let _ = write!(
                out,
                r#"<text x="0" y="{:.1}" font-size="10">{}</text>"#,
                ry + cell - 4.0,
                esc(&truncate(row, 34))
            );
            for (j, col) in b.cols.iter().enumerate() {
                let Some(&(x, n, errors)) = b.cells.get(&(row.clone(), col.clone())) else { continue };
                let (fill, text) = if n == 0 {
                    ("#9e9e9e".to_string(), format!("{errors} error(s)"))
                } else {
                    (
                        heat(x as f64 / n as f64),
                        format!(
                            "{x}/{n} landed{}",
                            if errors > 0 { format!(", {errors} error(s)") } else { String::new() }
                        ),
                    )
                };
                let _ = write!(
                    out,
                    r##"<rect x="{:.1}" y="{ry:.1}" width="{:.1}" height="{:.1}" fill="{fill}" stroke="#fff"><title>{} × {}: {text}</title></rect>"##,
                    LABEL_W + j as f64 * cell,
                    cell,
                    cell,
                    esc(row),
                    esc(col)
                );
            }
        }
        y += b.rows.len() as f64 * cell + 14.0;
    }
    out.push_str("</svg>");
    out
}

/// A line chart over runs in time order: x = run index, y = 0–100 %; each series a
/// list of (label, value) with None gaps.
pub fn line_chart(
    id: &str,
    title: &str,
    xlabels: &[String],
    series: &[(&str, &'static str, Vec<Option<f64>>)],
) -> String {
    let (w, h, left, top, plot_h) = (720.0, 230.0, 50.0, 28.0, 160.0);
    let plot_w = w - left - 20.0;
    let step = if xlabels.len() > 1 { plot_w / (xlabels.len() - 1) as f64 } else { 0.0 };
    let px = |i: usize| left + if xlabels.len() > 1 { i as f64 * step } else { plot_w / 2.0 };
    let py = |v: f64| top + plot_h * (1.0 - v.clamp(0.0, 1.0));
    let mut out = open_chart(id, title, title, w, h);
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let y = py(tick);
        let _ = write!(
            out,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end" fill="#666">{:.0} %</text>"##,
            left + plot_w,
            left - 4.0,
            y + 3.0,
            tick * 100.0
        );
    }
    for (k, (name, colour, values)) in series.iter().enumerate() {
        let pts: Vec<String> =
            values.iter().enumerate().filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", px(i), py(v)))).collect();
        if pts.len() > 1 {
            let _ =
                write!(out, r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        }
        for (i, v) in values.iter().enumerate() {
            if let Some(v) = v {
                let _ = write!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"><title>{}: {} — {}</title></circle>"#,
                    px(i),
                    py(*v),
                    esc(name),
                    pct(*v),
                    esc(&xlabels[i])
                );
            }
        }
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" fill="{colour}">{}</text>"#,
            left + 10.0 + 110.0 * k as f64,
            h - 8.0,
            esc(name)
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn heat_runs_green_to_red() {
        assert_eq!(heat(0.0), "#e8f5e9");
        assert_eq!(heat(1.0), "#c62828");
    }

    #[test]
    fn line_chart_has_class_and_points() {
        let s = line_chart("t", "T", &["a".into(), "b".into()], &[("ASR", "#c00", vec![Some(0.1), Some(0.2)])]);
        assert!(s.contains(r#"class="chart""#) && s.contains("<polyline"));
    }
}
