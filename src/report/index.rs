//! `reports/index.html`: the trend over every judged run below a reports folder — each
//! version's latest verdict per plan, and ASR / utility over time per plan. Reads
//! `judgement.json` files leniently (as JSON values), so an older or foreign judgement
//! is shown with what it has instead of breaking the index; an unreadable one is listed
//! as skipped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use super::svg::{self, esc, pct};
use super::{page, verdict_class};
use crate::record::Verdict;
use crate::util;

/// How deep below the reports folder judgements are looked for
/// (reports/<version>/<plan>/<run>/judgement.json is 3).
const MAX_DEPTH: usize = 6;

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    run_id: String,
    version: String,
    plan: String,
    verdict: Option<Verdict>,
    /// started_at, else judged_at (RFC 3339 sorts as text).
    when: String,
    asr: Option<f64>,
    utility: Option<f64>,
    /// report.html relative to the reports folder, '/'-separated.
    link: Option<String>,
}

/// Rewrites `reports_dir/index.html` from every `judgement.json` below it.
pub fn write_index(reports_dir: &Path) -> anyhow::Result<()> {
    // A run written elsewhere (`--out`) into a root without runs yet still gets an index.
    std::fs::create_dir_all(reports_dir).with_context(|| format!("creating {}", reports_dir.display()))?;
    let mut files = Vec::new();
    find_judgements(reports_dir, 0, &mut files).with_context(|| format!("scanning {}", reports_dir.display()))?;
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    for file in files {
        match read_entry(reports_dir, &file) {
            Ok(e) => entries.push(e),
            Err(err) => {
                tracing::warn!("index: skipping {}: {err:#}", file.display());
                skipped.push(format!("{}: {err:#}", file.display()));
            }
        }
    }
    entries.sort_by(|a, b| (&a.when, &a.run_id).cmp(&(&b.when, &b.run_id)));
    util::write_atomic(&reports_dir.join("index.html"), render(&entries, &skipped).as_bytes())
}

fn find_judgements(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let mut children: Vec<_> = std::fs::read_dir(dir)?.filter_map(Result::ok).collect();
    children.sort_by_key(|e| e.file_name());
    for child in children {
        let path = child.path();
        // Symlinks are not followed: a loop or a link out of the reports folder must
        // not end up in the index.
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() {
            find_judgements(&path, depth + 1, out)?;
        } else if meta.is_file() && child.file_name() == "judgement.json" {
            out.push(path);
        }
    }
    Ok(())
}

/// A rate from telemetry: a number, or an object with `rate`/`value`/`mean`.
fn rate_of(v: Option<&Value>) -> Option<f64> {
    let v = v?;
    v.as_f64().or_else(|| ["rate", "value", "mean"].iter().find_map(|k| v.get(k)?.as_f64()))
}

fn read_entry(reports_dir: &Path, file: &Path) -> anyhow::Result<Entry> {
    let text = std::fs::read_to_string(file)?;
    let j: Value = serde_json::from_str(&text).context("not JSON")?;
    let s = |k: &str| j.get(k).and_then(Value::as_str).map(str::to_string);
    let run_id = s("run_id").context("no run_id")?;
    let dir = file.parent().unwrap_or(reports_dir);
    let telemetry: Option<Value> =
        std::fs::read_to_string(dir.join("telemetry.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
    let figure = |k: &str| j.get("figures").and_then(|f| f.get(k)).and_then(|e| e.get("rate")).and_then(Value::as_f64);
    let tele = |k: &str| rate_of(telemetry.as_ref().and_then(|t| t.get(k)));
    let link = dir.join("report.html").strip_prefix(reports_dir).ok().map(|rel| {
        rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
    });
    Ok(Entry {
        run_id,
        version: s("version").unwrap_or_else(|| "?".into()),
        plan: s("plan").unwrap_or_else(|| "?".into()),
        verdict: j.get("verdict").and_then(|v| serde_json::from_value(v.clone()).ok()),
        when: s("started_at").or_else(|| s("judged_at")).unwrap_or_default(),
        asr: figure("asr").or_else(|| tele("asr")),
        utility: figure("utility_clean").or_else(|| tele("utility")),
        link,
    })
}

fn badge(e: &Entry) -> String {
    let (class, word) = match e.verdict {
        Some(v) => (verdict_class(v), v.as_str()),
        None => ("s-not_applicable", "?"),
    };
    let inner = format!(r#"<span class="s {class}">{word}</span>"#);
    match &e.link {
        Some(l) => format!(r#"<a href="{}">{inner}</a>"#, esc(l)),
        None => inner,
    }
}

fn render(entries: &[Entry], skipped: &[String]) -> String {
    let mut b = String::from("<h1>pruefstand — verdicts and trends</h1>");
    let _ = write!(b, r#"<p class="meta">{} judged run(s)</p>"#, entries.len());
    // Latest verdict per (version, plan): entries are in time order, so the last wins.
    let plans: Vec<&str> = {
        let mut p: Vec<&str> = entries.iter().map(|e| e.plan.as_str()).collect();
        p.sort();
        p.dedup();
        p
    };
    let mut latest: BTreeMap<&str, BTreeMap<&str, &Entry>> = BTreeMap::new();
    for e in entries {
        latest.entry(&e.version).or_default().insert(&e.plan, e);
    }
    b.push_str(r#"<h2>Latest verdict per version and plan</h2><table id="latest"><tr><th>version</th>"#);
    for p in &plans {
        let _ = write!(b, "<th>{}</th>", esc(p));
    }
    b.push_str("</tr>");
    for (version, by_plan) in &latest {
        let _ = write!(b, "<tr><td>{}</td>", esc(version));
        for p in &plans {
            match by_plan.get(p) {
                Some(e) => {
                    let _ = write!(b, r#"<td>{} <span class="note">{}</span></td>"#, badge(e), esc(&e.when));
                }
                None => b.push_str("<td>–</td>"),
            }
        }
        b.push_str("</tr>");
    }
    b.push_str("</table>");

    for p in &plans {
        let runs: Vec<&Entry> = entries.iter().filter(|e| e.plan == *p).collect();
        let labels: Vec<String> = runs.iter().map(|e| format!("{} ({})", e.version, e.when)).collect();
        let series = [
            ("ASR", "#c62828", runs.iter().map(|e| e.asr).collect()),
            ("utility", "#1565c0", runs.iter().map(|e| e.utility).collect()),
        ];
        let _ = write!(b, "<h2>Plan {}</h2>", esc(p));
        b.push_str(&svg::line_chart(
            &format!("trend-{p}"),
            &format!("ASR and clean utility over time — {p}"),
            &labels,
            &series,
        ));
    }

    b.push_str(r#"<h2>All runs</h2><table id="runs"><tr><th>when</th><th>version</th><th>plan</th><th>verdict</th><th>ASR</th><th>utility</th><th>run</th></tr>"#);
    let opt = |v: Option<f64>| v.map(pct).unwrap_or_else(|| "–".into());
    for e in entries.iter().rev() {
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&e.when),
            esc(&e.version),
            esc(&e.plan),
            badge(e),
            opt(e.asr),
            opt(e.utility),
            esc(&e.run_id)
        );
    }
    b.push_str("</table>");
    if !skipped.is_empty() {
        b.push_str("<h2>Skipped</h2><ul>");
        for s in skipped {
            let _ = write!(b, "<li>{}</li>", esc(s));
        }
        b.push_str("</ul>");
    }
    page("pruefstand — trends", &b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge;

    #[test]
    fn index_shows_latest_verdicts_and_trends() {
        let dir = tempfile::tempdir().unwrap();
        let reports = dir.path();
        for (i, (version, landed)) in [("v1", 0usize), ("v2", 30), ("v1", 3)].into_iter().enumerate() {
            let mut input = judge::tests::schnell(landed);
            input.run.run_id = format!("run-{i}");
            input.run.version = version.into();
            input.run.started_at = Some(format!("2025-01-0{}T00:00:00Z", i + 1));
            let j = judge::judge(&input);
            let run_dir = reports.join(version).join("schnell").join(&input.run.run_id);
            super::super::write_run_report(&run_dir, &j, &input).unwrap();
        }
        // A telemetry-only figure and a corrupt judgement.
        std::fs::create_dir_all(reports.join("x/<b>/r")).unwrap();
        std::fs::write(reports.join("x/<b>/r/judgement.json"), "{not json").unwrap();
        write_index(reports).unwrap();
        let html = std::fs::read_to_string(reports.join("index.html")).unwrap();
        assert!(html.contains(r#"class="chart""#) && html.contains("<polyline"));
        // v1's latest verdict is run-2 (inconclusive), not run-0 (approved).
        let latest = &html[html.find(r#"id="latest""#).unwrap()..html.find("<h2>Plan").unwrap()];
        assert!(latest.contains("inconclusive") && !latest.contains("approved"), "{latest}");
        assert!(latest.contains("rejected"));
        assert!(html.contains(r#"href="v1/schnell/run-0/report.html""#));
        assert!(html.contains("Skipped") && html.contains("&lt;b&gt;"));
    }

    #[test]
    fn telemetry_rates_fill_in() {
        assert_eq!(rate_of(Some(&serde_json::json!(0.25))), Some(0.25));
        assert_eq!(rate_of(Some(&serde_json::json!({"rate": 0.5}))), Some(0.5));
        assert_eq!(rate_of(Some(&serde_json::json!("x"))), None);
    }
}
