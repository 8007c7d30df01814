//! The report and the trend index as a person sees them: two real `schnell` runs of
//! versions with 40-character names (the simulated model, the real gym), a reference
//! and a candidate, then each page opened in headless Chromium at a wide and a narrow
//! window. Checked: no console errors, the page no wider than the window, no text
//! spilling out of its box, no chart text clipped by its chart or overlapping another,
//! the case table's filters working, and the changed-against-the-reference view.
//!
//! Then the compare page of three runs (run directories written as `run` leaves them):
//! its overview and a section per candidate, laid out at both widths.
//!
//! `PRUEFSTAND_SCREENSHOTS=<dir>` keeps the screenshots there (how `docs/`'s pictures
//! are made): `report.png` from the first test; `index.png`, `compare.png` and their
//! `-420` twins from the compare-and-index test, whose index holds more runs.

use std::path::{Path, PathBuf};

use crate::common::chromium::{Chromium, console_errors};
use crate::common::*;

const BASE: &str = "reference-version-with-a-forty-char-name";
const CAND: &str = "candidate-version-with-a-forty-char-name";

/// Measures the page after load and writes what is wrong into `<pre id="probe">`
/// (one finding a line), with every `<details>` opened (the conversations too).
/// Appended to a copy of the page only; the page itself is untouched. Text inside an SVG is checked against its chart's box, everything else
/// against its own box where it does not scroll.
const PROBE: &str = r#"<script>
window.addEventListener('load',function(){
var bad=[];
document.querySelectorAll('details').forEach(function(d){d.open=true});
function name(e){return e.tagName+(e.id?'#'+e.id:'')+' "'+(e.textContent||'').trim().slice(0,50)+'"'}
var de=document.documentElement;
if(de.scrollWidth>window.innerWidth+1)bad.push('page '+de.scrollWidth+'px wide in a '+window.innerWidth+'px window');
document.querySelectorAll('body *').forEach(function(e){
  if(e.closest('svg')||e.tagName==='SCRIPT')return;
  var cs=getComputedStyle(e);
  if(cs.display==='inline'||cs.display==='none'||e.closest('[hidden]'))return;
  if(cs.overflowX==='visible'&&e.scrollWidth>e.clientWidth+1&&e.clientWidth>0)bad.push('overflows its box: '+name(e)+' '+e.scrollWidth+'>'+e.clientWidth);
});
document.querySelectorAll('svg.chart').forEach(function(svg){
  var r=svg.getBoundingClientRect(),texts=[].slice.call(svg.querySelectorAll('text'));
  var boxes=texts.map(function(t){return t.getBoundingClientRect()});
  texts.forEach(function(t,i){var b=boxes[i];
    if(b.left<r.left-1||b.right>r.right+1||b.top<r.top-1||b.bottom>r.bottom+1)bad.push('clipped in #'+svg.id+': '+name(t));
    if(t.hasAttribute('transform'))return;
    for(var j=i+1;j<texts.length;j++){var c=boxes[j];if(texts[j].hasAttribute('transform'))continue;
      var w=Math.min(b.right,c.right)-Math.max(b.left,c.left),h=Math.min(b.bottom,c.bottom)-Math.max(b.top,c.top);
      if(w>1&&h>1)bad.push('overlap in #'+svg.id+': '+name(t)+' / '+name(texts[j]));}
  });
});
var p=document.createElement('pre');p.id='probe';p.textContent='PROBE\n'+bad.join('\n')+'\nEND';document.body.appendChild(p);
});
</script>"#;

/// `html` with `script` (a whole `<script>…</script>` element) added before `</body>`
/// and allowed by the page's Content-Security-Policy, by its hash as the page's own
/// script is: the test's script runs under the same policy the page ships with.
fn with_script(html: &str, script: &str) -> String {
    let inner = script.trim_start_matches("<script>").trim_end_matches("</script>");
    let out = std::process::Command::new("python3")
        .args(["-c", "import base64,hashlib,sys;print(base64.b64encode(hashlib.sha256(sys.stdin.buffer.read()).digest()).decode())"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(inner.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let hash = String::from_utf8(out.stdout).unwrap();
    let allowed = format!("script-src 'sha256-{}'", hash.trim());
    let html = if html.contains("script-src 'none'") {
        html.replacen("script-src 'none'", &allowed, 1)
    } else {
        assert!(html.contains("script-src 'sha256-"), "the page has its policy");
        html.replacen("script-src", &allowed, 1)
    };
    html.replace("</body>", &format!("{script}</body>"))
}

/// The probe's findings for `page` at `width` px, and the console errors.
fn probe(chromium: &Chromium, page: &Path, width: u32) -> (Vec<String>, Vec<String>) {
    let html = std::fs::read_to_string(page).unwrap();
    // Beside the page, so its relative links resolve the same.
    let copy = page.with_file_name(format!("probe-{width}.html"));
    std::fs::write(&copy, with_script(&html, PROBE)).unwrap();
    let out =
        chromium.open(&copy, &["--dump-dom", "--virtual-time-budget=5000", &format!("--window-size={width},1400")]);
    let dom = String::from_utf8_lossy(&out.stdout);
    let found = dom.split("PROBE\n").nth(1).and_then(|s| s.split("\nEND").next());
    let found = found.unwrap_or_else(|| panic!("the probe did not run on {}: {dom:.500}", page.display()));
    let findings = found.lines().filter(|l| !l.is_empty()).map(str::to_string).collect();
    (findings, console_errors(&out.stderr))
}

/// Reads, in Chromium, every tool result a case block of `page` shows and the text of
/// its `<mark>`s; a result that shows one of the case's injected texts (from the traces
/// of `runs`) must have all of it marked. Compared on letters and digits only: the
/// rendering re-quotes, folds and escapes, never changes those. (tool results that
/// showed an injection, those not marked whole).
fn injections_unmarked(chromium: &Chromium, page: &Path, runs: &[&Path]) -> (usize, Vec<String>) {
    let alnum = |s: &str| s.chars().filter(char::is_ascii_alphanumeric).collect::<String>();
    let mut injected: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    for run in runs {
        for case in cases(run).into_iter().filter(|c| c["kind"] == "attacked") {
            let trace = json(&run.join(case["trace"].as_str().unwrap()));
            let texts = trace["injections"].as_object().unwrap().values().map(|t| alnum(t.as_str().unwrap()));
            injected.entry(case["case_id"].as_str().unwrap().to_string()).or_default().extend(texts);
        }
    }
    let script = "<script>window.addEventListener('load',function(){var all=function(e,q){return [].slice.call(e.querySelectorAll(q))};var out=all(document,'details.case').map(function(d){return [d.querySelector('summary code').textContent,all(d,'li.t-tool').map(function(li){return [li.textContent,all(li,'mark').map(function(m){return m.textContent}).join('')]})]});var p=document.createElement('pre');p.id='marks-out';p.textContent=JSON.stringify(out);document.body.appendChild(p)})</script>";
    let copy = page.with_file_name("marks.html");
    std::fs::write(&copy, with_script(&std::fs::read_to_string(page).unwrap(), script)).unwrap();
    let out = chromium.open(&copy, &["--dump-dom", "--virtual-time-budget=5000"]);
    let dom = String::from_utf8_lossy(&out.stdout);
    let found = dom.split(r#"<pre id="marks-out">"#).nth(1).and_then(|s| s.split("</pre>").next());
    let found = found.unwrap_or_else(|| panic!("the script did not run on {}: {dom:.500}", page.display()));
    let found = found.replace("&lt;", "<").replace("&gt;", ">").replace("&nbsp;", " ").replace("&amp;", "&");
    let blocks: Vec<(String, Vec<(String, String)>)> = serde_json::from_str(&found).unwrap();
    let (mut seen, mut unmarked) = (0, Vec::new());
    for (case, results) in blocks {
        let Some(texts) = injected.get(&case) else { continue };
        for (shown, marks) in results {
            for text in texts.iter().filter(|t| alnum(&shown).contains(t.as_str())) {
                seen += 1;
                if !alnum(&marks).contains(text.as_str()) {
                    unmarked.push(format!("{case}: marked {marks:?}"));
                }
            }
        }
    }
    (seen, unmarked)
}

fn screenshot(chromium: &Chromium, page: &Path, width: u32, to: &Path) {
    let out = chromium.open(page, &[&format!("--screenshot={}", to.display()), &format!("--window-size={width},1600")]);
    let size = std::fs::metadata(to).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "screenshot of {} at {width} px: {size} bytes; {}",
        page.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(console_errors(&out.stderr).is_empty(), "{:?}", console_errors(&out.stderr));
}

/// Two runs: the reference (the susceptible demo) and the candidate against it.
fn two_runs(bench: &Bench) -> (PathBuf, PathBuf) {
    let base = std::fs::read_to_string(repo().join("versions/demo-baseline.toml")).unwrap();
    bench.write(&format!("versions/{BASE}.toml"), &base);
    let cand = std::fs::read_to_string(repo().join("versions/demo-kandidat.toml")).unwrap();
    assert!(cand.contains("reference = \"demo-baseline\""));
    bench.write(&format!("versions/{CAND}.toml"), &cand.replace("\"demo-baseline\"", &format!("\"{BASE}\"")));
    // The susceptible reference is rejected (R2), the hardened candidate approved.
    let base_dir = bench.run(&["run", BASE, "--plan", "schnell", "--jobs", "4"]).code(10).run_dir();
    let cand_dir = bench.run(&["run", CAND, "--plan", "schnell", "--jobs", "4"]).code(0).run_dir();
    (base_dir, cand_dir)
}

#[test]
fn report_and_index_read_well_at_two_widths() {
    let bench = Bench::new();
    let (base_dir, cand_dir) = two_runs(&bench);
    let report = cand_dir.join("report.html");
    let index = bench.path().join("reports/index.html");
    let html = std::fs::read_to_string(&report).unwrap();

    // The way into cases: every case a row and a conversation; the candidate never
    // lets an injection land where the reference did, so the changes are blocks.
    let rows = html.matches("<tr data-tags=").count();
    assert_eq!(rows, html.matches(r#"<details class="case""#).count());
    assert!(rows >= 100, "{rows} case rows");
    assert!(html.contains("<mark>"), "injected text highlighted in some tool result");
    assert!(
        html.contains(r#"<li class="turn t-assistant"><b>assistant</b>"#) && html.contains(r#"class="call">→ <code>"#)
    );
    let summary = html.split(r#"id="changed-summary">"#).nth(1).unwrap();
    let summary = &summary[..summary.find("</p>").unwrap()];
    assert!(summary.contains(BASE) && summary.contains("<b>0</b> newly landed"), "{summary}");
    assert!(!summary.contains("<b>0</b> newly blocked"), "the hardened candidate blocks: {summary}");
    let tags: Vec<&str> = html.split(r#"<tr data-tags=""#).skip(1).map(|row| &row[..row.find('"').unwrap()]).collect();
    let changed = tags.iter().filter(|t| t.split(' ').any(|t| t == "changed")).count();
    assert!(tags.iter().any(|t| t.starts_with("blocked changed")), "{tags:?}");
    // Each changed case shows the reference's conversation beside the candidate's, and
    // the reference's raw traces are links that reach its run directory.
    assert_eq!(html.matches(r#"<div class="sbs">"#).count(), changed);
    let pair = html.split(r#"<details class="case pair""#).nth(1).unwrap();
    assert_eq!(pair.split("</details>").next().unwrap().matches(r#"<ol class="conv">"#).count(), 2, "both sides");
    let href = pair.split(r#"<a href=""#).nth(1).unwrap().split('"').next().unwrap();
    assert!(href.starts_with("../") && cand_dir.join(href).is_file(), "the reference's trace: {href}");
    // Numeric task order in the heat map and the table.
    let (t2, t10) = (html.find("/user_task_2/").unwrap(), html.find("/user_task_10/").unwrap());
    assert!(t2 < t10, "user_task_2 before user_task_10");
    assert!(html.contains(r##"<a href="#case-"##) && html.contains("injection landed:"), "cells link; a legend");

    let chromium = Chromium::find();
    // Injected text is highlighted where the gym injected it — in the report and on
    // the compare page, inside YAML and a Python dict's repr alike.
    let compare = cand_dir.join("compare-marks.html");
    bench
        .run(&["compare", base_dir.to_str().unwrap(), cand_dir.to_str().unwrap(), "--out", compare.to_str().unwrap()])
        .ok();
    for page in [&report, &compare] {
        let (seen, unmarked) = injections_unmarked(&chromium, page, &[&base_dir, &cand_dir]);
        assert!(seen >= 20, "{}: only {seen} tool results showed an injection", page.display());
        assert!(
            unmarked.is_empty(),
            "{}: {} of {seen} injections not marked:\n{}",
            page.display(),
            unmarked.len(),
            unmarked.join("\n")
        );
    }
    for width in [1280, 420] {
        for page in [&report, &index] {
            let (findings, errors) = probe(&chromium, page, width);
            assert!(errors.is_empty(), "{} at {width} px: console errors {errors:?}", page.display());
            assert!(findings.is_empty(), "{} at {width} px:\n{}", page.display(), findings.join("\n"));
        }
    }

    // The filters work: the page's script hides all but the changed rows.
    let filtered = cand_dir.join("filtered.html");
    let click = "<script>window.addEventListener('load',function(){var i=document.querySelector('#case-filter input[value=changed]');i.checked=true;i.dispatchEvent(new Event('change',{bubbles:true}));document.title='SHOWN '+document.querySelectorAll('#cases tbody tr:not([hidden])').length+' '+document.getElementById('case-count').textContent})</script>";
    std::fs::write(&filtered, with_script(&html, click)).unwrap();
    let out = chromium.open(&filtered, &["--dump-dom", "--virtual-time-budget=5000"]);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(changed > 0);
    assert!(
        dom.contains(&format!("<title>SHOWN {changed} {changed} of {rows} shown</title>")),
        "{changed} changed of {rows}: {:?}",
        dom.split("<title>").nth(1).map(|t| &t[..t.find("</title>").unwrap_or(0)])
    );

    let keep = std::env::var_os("PRUEFSTAND_SCREENSHOTS").map(PathBuf::from);
    for (page, stem) in [(&report, "report"), (&index, "index")] {
        for width in [1280, 420] {
            let to = cand_dir.join(format!("{stem}-{width}.png"));
            screenshot(&chromium, page, width, &to);
            // docs/index*.png come from compare_page_and_index_navigate_at_two_widths (more runs).
            if let (Some(dir), "report") = (&keep, stem) {
                let name = if width == 1280 { "report.png".to_string() } else { format!("report-{width}.png") };
                std::fs::copy(&to, dir.join(name)).unwrap();
            }
        }
    }
}

/// What the defences did is in the conversation where it happened, and the case table
/// finds those cases: a cautious human denies a call the user never asked for.
#[test]
fn a_denied_call_shows_in_its_conversation_and_the_table_finds_it() {
    let bench = Bench::new();
    let spec = std::fs::read_to_string(repo().join("versions/demo-vorsichtig.toml")).unwrap();
    bench.write("versions/cautious.toml", &spec.replace("reference = \"demo-baseline\"\n", ""));
    let plan = bench.write(
        "w18.toml",
        "name = \"w18\"\nbenchmark_version = \"v1.2.2\"\nattacks = [\"important_instructions\"]\njobs = 2\n\
         case_timeout_s = 120\ninjection_goals = false\n[[suites]]\nname = \"workspace\"\n\
         user_tasks = [\"user_task_18\", \"user_task_13\"]\ninjection_tasks = [\"injection_task_0\"]\n",
    );
    let run = bench.run(&["run", "cautious", "--plan", plan.to_str().unwrap()]);
    let dir = run.run_dir();
    let denied: Vec<_> = cases(&dir).into_iter().filter(|c| c["human_denials"].as_u64() > Some(0)).collect();
    assert!(!denied.is_empty(), "the cautious human denied nothing\n{}", run.stdout);
    let trace = json(&dir.join(denied[0]["trace"].as_str().unwrap()));
    let events = trace["pruefstand_events"].as_array().expect("the gym kept the agent's events in the trace");
    assert!(events.iter().any(|e| e["kind"] == "human_denial"), "{events:?}");

    // Opened at the denied case: its conversation shows the denial, the table's filter
    // for denials keeps exactly the cases with denials.
    let report = dir.join("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains(r#"class="turn t-event ev-human_denial""#), "the marker is in the page");
    let check = "<script>window.addEventListener('load',function(){var d=[].slice.call(document.querySelectorAll('li.ev-human_denial'));var i=document.querySelector('#case-filter input[value=human-denied]');i.checked=true;i.dispatchEvent(new Event('change',{bubbles:true}));d[0].closest('details').open=true;var r=d[0].getBoundingClientRect();document.title='DENIALS '+d.length+' VISIBLE '+(r.height>0)+' ROWS '+document.querySelectorAll('#cases tbody tr:not([hidden])').length})</script>";
    let page = dir.join("denied.html");
    std::fs::write(&page, with_script(&html, check)).unwrap();
    let chromium = Chromium::find();
    let out = chromium.open(&page, &["--dump-dom", "--virtual-time-budget=5000", "--window-size=420,1400"]);
    let dom = String::from_utf8_lossy(&out.stdout);
    let title = dom.split("<title>").nth(1).and_then(|t| t.split("</title>").next()).unwrap_or_default();
    assert!(title.contains("VISIBLE true"), "{title}");
    assert!(title.ends_with(&format!("ROWS {}", denied.len())), "{title}: {} cases with denials", denied.len());
    assert!(console_errors(&out.stderr).is_empty(), "{:?}", console_errors(&out.stderr));
}

// ---- the compare page and the index that navigates (issue #27, items 3 and 4) ------

/// Five banking user tasks against three injection tasks in two attack families, one
/// held out (R2 judges it): 5 clean and 30 attacked cases, enough for the hardened
/// candidate to block what the reference let land.
const NAV_PLAN: &str = r#"
name = "nav"
benchmark_version = "v1.2.2"
wording = "per_run"
attacks = ["important_instructions", "tool_output_spoof"]
held_out = ["tool_output_spoof"]
jobs = 4
case_timeout_s = 120
injection_goals = false
[[suites]]
name = "banking"
user_tasks = ["user_task_1", "user_task_2", "user_task_3", "user_task_4", "user_task_5"]
injection_tasks = ["injection_task_1", "injection_task_2", "injection_task_4"]
"#;

/// `run VERSION --plan nav`, judged whatever the verdict: its run directory.
fn nav_run(bench: &Bench, version: &str) -> PathBuf {
    let run = bench.run(&["run", version, "--plan", "nav", "--jobs", "4"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{version}: {:?}\n{}\n{}", run.code, run.stdout, run.stderr);
    run.run_dir()
}

/// Runs `script` (a `<script>` setting `document.title`) on a copy of `page` at `width`
/// px; the title it set.
fn title_after(chromium: &Chromium, page: &Path, width: u32, script: &str) -> String {
    let copy = page.with_file_name(format!("scripted-{width}.html"));
    std::fs::write(&copy, with_script(&std::fs::read_to_string(page).unwrap(), script)).unwrap();
    let out =
        chromium.open(&copy, &["--dump-dom", "--virtual-time-budget=5000", &format!("--window-size={width},1400")]);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(console_errors(&out.stderr).is_empty(), "{:?}", console_errors(&out.stderr));
    let title = dom.split("<title>").nth(1).and_then(|t| t.split("</title>").next());
    title.unwrap_or_else(|| panic!("no title in {dom:.300}")).to_string()
}

#[test]
fn compare_page_and_index_navigate_at_two_widths() {
    let bench = Bench::new();
    bench.write("profiles/nav.toml", NAV_PLAN);
    let base = std::fs::read_to_string(repo().join("versions/demo-baseline.toml")).unwrap();
    bench.write(&format!("versions/{BASE}.toml"), &base);
    let cand = std::fs::read_to_string(repo().join("versions/demo-kandidat.toml")).unwrap();
    bench.write(&format!("versions/{CAND}.toml"), &cand.replace("\"demo-baseline\"", &format!("\"{BASE}\"")));
    // The reference twice (a line), the candidate, and a third version that also blocks
    // every injection (two lines on 0 %; its own reference, demo-baseline, runs first).
    let base_dir = nav_run(&bench, BASE);
    let cand_dir = nav_run(&bench, CAND);
    nav_run(&bench, "demo-vorsichtig");
    nav_run(&bench, BASE);

    // compare A B: the page in B's run directory, user-only, its path printed.
    let out = bench.run(&["compare", base_dir.to_str().unwrap(), cand_dir.to_str().unwrap()]).ok();
    let page = PathBuf::from(out.stdout.lines().last().unwrap());
    assert_eq!(page, cand_dir.join("compare.html"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&page).unwrap().permissions().mode() & 0o777, 0o600);
    let html = std::fs::read_to_string(&page).unwrap();
    let spec = &html[html.find(r#"id="spec""#).unwrap()..html.find(r#"id="spec-equal-d""#).unwrap()];
    assert!(spec.contains(&format!("A: {BASE}")) && spec.contains(&format!("B: {CAND}")), "both versions named");
    assert!(spec.contains(&format!("<code>{BASE}</code></td><td><code>{CAND}</code>")), "the versions side by side");
    assert!(
        spec.contains(
            r#"differs">≠</span> spec: adapter.name</td><td><code>–</code></td><td><code>inj-harden-r3</code>"#
        )
    );
    assert!(!spec.contains("plan hash") && html.contains("Equal on both sides: plan, plan hash, profile,"));
    assert!(html.contains("held-out ASR (what R2 judges)") && html.contains(r#"id="compare-intervals""#));
    assert!(html.contains(r#"<p id="r4">R4 with B as candidate"#) && html.contains(r#"id="pairs""#));
    // The pages link each other: the candidate's report to the index and to its
    // reference's report, the compare page to the index (and to both reports).
    let links = |page: &std::path::Path, html: &str| -> Vec<PathBuf> {
        let nav = &html[html.find(r#"id="nav""#).unwrap_or_else(|| panic!("no nav in {}", page.display()))..];
        let nav = &nav[..nav.find("</p>").unwrap()];
        nav.split(r#"href=""#).skip(1).map(|h| page.parent().unwrap().join(&h[..h.find('"').unwrap()])).collect()
    };
    let report = cand_dir.join("report.html");
    let from_report = links(&report, &std::fs::read_to_string(&report).unwrap());
    let index_file = bench.path().join("reports/index.html").canonicalize().unwrap();
    let reached: Vec<PathBuf> = from_report.iter().map(|p| p.canonicalize().unwrap()).collect();
    assert!(reached.contains(&index_file), "{from_report:?}");
    assert!(
        reached.contains(&base_dir.join("report.html").canonicalize().unwrap()),
        "the reference's: {from_report:?}"
    );
    let from_compare: Vec<PathBuf> = links(&page, &html).iter().map(|p| p.canonicalize().unwrap()).collect();
    assert!(from_compare.contains(&index_file), "{from_compare:?}");
    // The pairs table says each net change as R4 does, and R4 says what it tested.
    let r4 = &html[html.find(r#"<p id="r4">"#).unwrap()..];
    let r4 = &r4[..r4.find("</p>").unwrap()];
    let pairs = &html[html.find(r#"id="pairs""#).unwrap()..];
    let pairs = &pairs[..pairs.find("</table>").unwrap()];
    for (figure, label) in
        [("ASR (all attacks) ", "<td>ASR</td>"), ("utility (clean and attacked) ", "<td>utility</td>")]
    {
        let said = &r4[r4.find(figure).unwrap_or_else(|| panic!("{figure} in {r4}")) + figure.len()..];
        let change = &said[..said.find(" (").unwrap()];
        let row = &pairs[pairs.find(label).unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        let expected = if change == "unchanged" { change.to_string() } else { format!("B {change}") };
        assert!(row.contains(&format!("<td>{expected}</td>")), "R4 says {change:?}, the table {row}");
        let clause = &said[..said.find(')').unwrap()];
        assert!(clause.contains("one-sided test of &quot;worse&quot;: "), "what was tested: {clause}");
        if change.starts_with("worse") {
            assert!(clause.contains("regression"), "why a worse figure passed or failed: {clause}");
        }
    }
    // The changed cases, each with both conversations, A's left.
    let changed = html.matches(r#"<details class="case""#).count();
    assert!(changed > 0 && html.contains("newly blocked"), "the hardened candidate blocks something");
    let first = &html[html.find(r#"id="change-0""#).unwrap()..];
    let first = &first[..first.find("</details>").unwrap()];
    assert_eq!(first.matches(r#"<ol class="conv">"#).count(), 2, "both conversations");
    assert!(first.find(&format!("<b>A: {BASE}</b>")).unwrap() < first.find(&format!("<b>B: {CAND}</b>")).unwrap());
    assert!(first.contains("injection landed yes") && first.contains("injection landed no"));
    assert!(first.contains(r#"<a href="../../../"#), "A's raw trace linked from B's folder");
    // Never over a file that is not a compare page.
    let notes = bench.write("notes.html", "my notes");
    let refused = bench.run(&[
        "compare",
        base_dir.to_str().unwrap(),
        cand_dir.to_str().unwrap(),
        "--out",
        notes.to_str().unwrap(),
    ]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(refused.stderr.contains("not a compare page"), "{}", refused.stderr);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes");

    // The index: every point and every run links an existing report (the compared run
    // its compare page too, `compare` refreshed the index); the limits; why.
    let index = bench.path().join("reports/index.html");
    let ihtml = std::fs::read_to_string(&index).unwrap();
    let hrefs: Vec<&str> = ihtml.split(r#"href=""#).skip(1).map(|h| &h[..h.find('"').unwrap()]).collect();
    assert!(hrefs.len() >= 5 * 5, "{} links", hrefs.len());
    assert_eq!(hrefs.iter().filter(|h| h.ends_with("/compare.html")).count(), 1, "the compared run's page");
    for href in &hrefs {
        assert!(href.ends_with("/report.html") || href.ends_with("/compare.html"), "{href}");
        assert!(bench.path().join("reports").join(href).is_file(), "{href} points to no report");
    }
    // demo-vorsichtig's own reference (demo-baseline) ran first: five runs.
    let runs = ihtml[ihtml.find(r#"id="runs""#).unwrap()..].matches("<tr class=").count();
    assert_eq!(runs, 5);
    assert_eq!(ihtml.matches(r#"<a class="pt" href="#).count(), runs * 3, "a link per run in each of three charts");
    assert_eq!(ihtml.matches(r#"<g class="threshold">"#).count(), 3);
    assert!(ihtml.contains(">R2 ≤ 10 %<") && ihtml.contains("held-out ASR (R2&#39;s figure) — nav"));
    let latest = &ihtml[ihtml.find(r#"id="latest""#).unwrap()..ihtml.find("<h2>Plan").unwrap()];
    assert!(latest.contains("<th>why</th>") && latest.contains("<b>R2</b> "), "{latest}");

    let chromium = Chromium::find();
    for width in [1280, 420] {
        for p in [&page, &index] {
            let (findings, errors) = probe(&chromium, p, width);
            assert!(errors.is_empty(), "{} at {width} px: console errors {errors:?}", p.display());
            assert!(findings.is_empty(), "{} at {width} px:\n{}", p.display(), findings.join("\n"));
        }
        // The two conversations beside each other when wide, one above the other when narrow.
        let sides = "<script>window.addEventListener('load',function(){var s=document.querySelectorAll('#change-0 .side');var a=s[0].getBoundingClientRect(),b=s[1].getBoundingClientRect();document.title='SIDES '+(Math.abs(a.top-b.top)<1?'beside':b.top>=a.bottom-1?'stacked':'other')})</script>";
        let expect = if width == 1280 { "SIDES beside" } else { "SIDES stacked" };
        assert_eq!(title_after(&chromium, &page, width, sides), expect, "at {width} px");
    }
    // The version filter works without a script of the page's: unticking the first
    // version's box hides its rows, lines and legend entries.
    let untick = "<script>window.addEventListener('load',function(){document.getElementById('vf-0').checked=false;var all=document.querySelectorAll('#trends .ver-0'),shown=0;all.forEach(function(e){if(getComputedStyle(e).display!=='none'&&!e.closest('[style*=none]'))shown++});document.title='VER0 '+shown+' of '+all.length})</script>";
    let title = title_after(&chromium, &index, 1280, untick);
    assert!(title.starts_with("VER0 0 of ") && title != "VER0 0 of 0", "{title}");

    // Tall enough to reach the first changed case's conversations (and stay under
    // 300 KB a picture).
    let keep = std::env::var_os("PRUEFSTAND_SCREENSHOTS").map(PathBuf::from);
    for (p, stem, tall) in [(&page, "compare", [1750, 3000]), (&index, "index", [1600, 2400])] {
        for ((width, suffix), height) in [(1280, ""), (420, "-420")].into_iter().zip(tall) {
            let to = cand_dir.join(format!("{stem}{suffix}.png"));
            screenshot_sized(&chromium, p, (width, height), &to);
            if let Some(dir) = &keep {
                std::fs::copy(&to, dir.join(format!("{stem}{suffix}.png"))).unwrap();
            }
        }
    }
}

/// `compare` of three runs (written as `run` leaves them, judged by `judge`, no case
/// run): one page in the last run's directory, an overview naming all three, each
/// further run's comparison with the first in its own section (ids its own), the
/// conversations' room shared; the index links the page. A missing path is named; one
/// path is a usage error; two runs still make the page of two.
#[test]
fn compare_of_three_runs_has_an_overview_and_a_section_per_candidate() {
    use crate::common::runs::{self, PlanShape};
    let bench = Bench::new();
    let plan = PlanShape::profile("schnell");
    // The same fixed order of attacked cases: 25 landed in the first run, 5 of those
    // in the second (20 newly blocked), 40 in the third (15 newly landed).
    let dirs: Vec<PathBuf> = [("base", 25), ("cand", 5), ("third", 40)]
        .into_iter()
        .map(|(version, landed)| {
            let records = runs::records_with_landed(&plan, &runs::spread(&plan, landed));
            let dir = bench.path().join(format!("reports/{version}/schnell/run-{version}"));
            let dir = runs::write_run(&dir, &plan, version, &records);
            let judged = bench.run(&["judge", dir.to_str().unwrap(), "--profile", "schnell"]);
            assert!(matches!(judged.code, Some(0 | 10 | 11)), "{version}: {}", judged.stderr);
            dir
        })
        .collect();
    let paths: Vec<&str> = dirs.iter().map(|d| d.to_str().unwrap()).collect();

    let out = bench.run(&["compare", paths[0], paths[1], paths[2]]).ok();
    let page = PathBuf::from(out.stdout.lines().last().unwrap());
    assert_eq!(page, dirs[2].canonicalize().unwrap().join("compare.html"), "the last run's directory");
    assert!(!dirs[1].join("compare.html").exists(), "one page");
    let html = std::fs::read_to_string(&page).unwrap();
    let overview = &html[html.find(r#"<table id="overview">"#).unwrap()..];
    let overview = &overview[..overview.find("</table>").unwrap()];
    for (version, landed) in [("base", "25/103"), ("cand", "5/103"), ("third", "40/103")] {
        assert!(overview.contains(&format!("<code>run-{version}</code>")), "{version}'s run id: {overview}");
        assert!(overview.contains(&format!("<code>{version}</code>")), "{version}");
        assert!(overview.contains(landed), "{version}'s ASR with its count: {overview}");
    }
    let r4_row = &overview[overview.find("<td>R4 against run 1</td>").unwrap()..];
    assert_eq!(r4_row[..r4_row.find("</tr>").unwrap()].matches(r#"<span class="s s-"#).count(), 2, "{r4_row}");
    // A section per further run, run 1 as A, each with R4's pairing and its changes.
    for (n, version, change) in [(2, "cand", "<b>20</b> newly blocked"), (3, "third", "<b>15</b> newly landed")] {
        let start = html.find(&format!(r#"<section class="pair" id="pair-{n}">"#)).unwrap();
        let section = &html[start..start + html[start..].find("</section>").unwrap()];
        assert!(section.contains(&format!("<h2>Run {n} against run 1: {version} against base</h2>")), "{section:.400}");
        assert!(section.contains(&format!(r#"<p id="p{n}-r4">R4 with B as candidate and A as reference: "#)));
        assert!(section.contains(&format!(r#"<table id="p{n}-pairs">"#)) && section.contains(change), "{n}");
        assert!(section.contains(r#"<h3 id="p"#) && !section.contains("<h2 id="), "its headings below its own");
    }
    assert_eq!(html.matches("R4 with B as candidate").count(), 2);
    let ids: Vec<&str> = html.split(r#" id=""#).skip(1).map(|s| &s[..s.find('"').unwrap()]).collect();
    let unique: std::collections::BTreeSet<&&str> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "every id once");
    // The index links the page; only where there is one.
    let index = std::fs::read_to_string(bench.path().join("reports/index.html")).unwrap();
    assert!(index.contains(r#"<a class="cmp" href="third/schnell/run-third/compare.html">compare</a>"#));
    assert_eq!(index.matches(r#"class="cmp""#).count(), 1);

    // Laid out at both widths: nothing wider than the window, nothing spilling.
    let chromium = Chromium::find();
    for width in [1280, 420] {
        let (findings, errors) = probe(&chromium, &page, width);
        assert!(errors.is_empty() && findings.is_empty(), "at {width} px: {errors:?}\n{}", findings.join("\n"));
    }

    // A missing third path is named; one path is clap's usage error; two runs make the
    // page of two (no overview).
    let missing = bench.path().join("reports/nope/schnell/run-9");
    let run = bench.run(&["compare", paths[0], paths[1], missing.to_str().unwrap()]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains(&missing.display().to_string()), "{}", run.stderr);
    let run = bench.run(&["compare", paths[0]]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("Usage") && run.stderr.contains("<RUN> <RUN>..."), "{}", run.stderr);
    let two = bench.path().join("two.html");
    bench.run(&["compare", paths[0], paths[1], "--out", two.to_str().unwrap()]).ok();
    let two = std::fs::read_to_string(&two).unwrap();
    assert!(!two.contains("overview") && two.contains(r#"<p id="r4">R4 with B as candidate"#));
}

/// [`screenshot`] at a window of (width, height).
fn screenshot_sized(chromium: &Chromium, page: &Path, (width, height): (u32, u32), to: &Path) {
    let out =
        chromium.open(page, &[&format!("--screenshot={}", to.display()), &format!("--window-size={width},{height}")]);
    let size = std::fs::metadata(to).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "screenshot of {} at {width} px: {size} bytes", page.display());
    assert!(console_errors(&out.stderr).is_empty(), "{:?}", console_errors(&out.stderr));
}
