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
    // The verdicts outshine the rule badges: each verdict a solid, dark badge in its
    // colour, R4's status beside it a light tint.
    let badges = "<script>window.addEventListener('load',function(){var row=function(t){return [].slice.call(document.querySelectorAll('#overview tr')).find(function(r){return r.cells[0].textContent===t})};var bg=function(q,t){return [].slice.call(row(t).querySelectorAll(q)).map(function(e){return getComputedStyle(e).backgroundColor})};document.title=JSON.stringify({r4:bg('.s','R4 against run 1'),verdicts:bg('.vb','verdict as judged (its own reference)')})})</script>";
    let seen = eval_page(&chromium, &page, 1280, badges);
    let (r4, verdicts) = (seen["r4"].as_array().unwrap(), seen["verdicts"].as_array().unwrap());
    assert!(r4.len() == 2 && verdicts.len() == 3, "{seen}");
    for colour in verdicts {
        assert!(VERDICT_RGB.contains(&colour.as_str().unwrap()), "a verdict in its colour: {seen}");
        assert!(luminance(colour.as_str().unwrap()) < 0.45, "a verdict's badge solid: {seen}");
    }
    for colour in r4 {
        assert!(luminance(colour.as_str().unwrap()) > 0.8, "R4's badge quieter than the verdicts: {seen}");
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

// ---- what a newcomer and the red team found on the pages (issue #64) ---------------

/// `(r,g,b)` of a CSS `rgb(…)`/`rgba(…)` colour, as Chromium computes it.
fn rgb(css: &str) -> (f64, f64, f64) {
    let inner = css.split('(').nth(1).and_then(|s| s.split(')').next()).unwrap_or_else(|| panic!("not rgb: {css}"));
    let v: Vec<f64> = inner.split(',').map(|p| p.trim().parse().unwrap()).collect();
    (v[0], v[1], v[2])
}

/// Relative luminance (0 black … 1 white) of a CSS colour.
fn luminance(css: &str) -> f64 {
    let lin = |c: f64| {
        let c = c / 255.0;
        if c <= 0.039_28 { c / 12.92 } else { ((c + 0.055) / 1.055).powf(2.4) }
    };
    let (r, g, b) = rgb(css);
    0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
}

/// The verdicts' colours as Chromium computes them (`#2e7d32` …), and the candidate's blue.
const VERDICT_RGB: [&str; 4] = ["rgb(46, 125, 50)", "rgb(198, 40, 40)", "rgb(239, 143, 0)", "rgb(106, 27, 154)"];
const CANDIDATE_RGB: &str = "rgb(21, 101, 192)";

/// Runs `script` (setting `document.title` to JSON) on a copy of `page`: the value.
fn eval_page(chromium: &Chromium, page: &Path, width: u32, script: &str) -> serde_json::Value {
    let title = title_after(chromium, page, width, script);
    let title = title.replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&");
    serde_json::from_str(&title).unwrap_or_else(|e| panic!("{e}: {title}"))
}

/// A candidate run whose reference is made for it: the report shows the reference
/// beside the candidate (the family table, the bars — a 0 % bar still drawn), the index
/// shows the reference as "reference" (no verdict was printed for it) and the candidate
/// in the colour of its verdict, its line in the report's blue; the terminal's rule lines
/// fit 100 columns without a terminal and the verdict is coloured only on one.
#[test]
fn a_candidate_and_its_reference_read_alike_on_every_page_and_the_terminal() {
    let bench = Bench::new();
    bench.write("profiles/nav.toml", NAV_PLAN);
    let base = std::fs::read_to_string(repo().join("versions/demo-baseline.toml")).unwrap();
    bench.write(&format!("versions/{BASE}.toml"), &base);
    let cand = std::fs::read_to_string(repo().join("versions/demo-kandidat.toml")).unwrap();
    bench.write(&format!("versions/{CAND}.toml"), &cand.replace("\"demo-baseline\"", &format!("\"{BASE}\"")));
    // Only the candidate is run: its reference is made for it, and never judged aloud.
    let run = bench.run(&["run", CAND, "--plan", "nav", "--jobs", "4"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
    let (cand_dir, base_dir) = (run.run_dir(), run.reference_dir());
    // Fifteen held-out cases: approved or undecided, whichever — the pages show it alike.
    let verdict = json(&cand_dir.join("judgement.json"))["verdict"].as_str().unwrap().to_string();
    let ansi = match verdict.as_str() {
        "approved" => "32",
        "rejected" => "31",
        "inconclusive" => "33",
        _ => "35",
    };
    assert!(!run.stdout.contains("verdict: rejected"), "no verdict printed for the reference:\n{}", run.stdout);
    assert_eq!(json(&base_dir.join("run.json"))["reference_for"], CAND);
    let base_report = std::fs::read_to_string(base_dir.join("report.html")).unwrap();
    assert!(base_report.contains(&format!(r#"id="reference-for">Made as the reference of <b>{CAND}</b>"#)));
    // The terminal (here a pipe): plain, the figure R2 judged and the rules within 100
    // columns (paths are not cut), the rule lines' reasons continuing under themselves.
    assert!(!run.stdout.contains('\x1b') && run.stdout.contains(&format!("\nverdict: {verdict}\n")), "{}", run.stdout);
    let judged: Vec<&str> = run
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("R2 judged: "))
        .take_while(|l| !l.starts_with("report: "))
        .collect();
    assert!(judged.len() > 5, "{}", run.stdout);
    for line in &judged {
        assert!(line.chars().count() <= 100, "{} columns: {line}", line.chars().count());
    }
    let rules: Vec<&str> = judged.iter().copied().skip_while(|l| !l.starts_with("  R1 ")).collect();
    assert!(
        rules.len() > 5 && rules.iter().all(|l| l.starts_with("  R") || l.starts_with(&" ".repeat(37))),
        "{rules:#?}"
    );
    // On a terminal 70 columns wide: the verdict bold in its colour, lines within 70; with
    // NO_COLOR set, plain. (The run is resumed: every case is recorded, none runs again.)
    let again = format!(
        "stty rows 40 cols 70; exec {} --root {} run {CAND} --plan nav --out {}",
        env!("CARGO_BIN_EXE_pruefstand"),
        bench.path().display(),
        cand_dir.display()
    );
    let (coloured, plain) = (format!("verdict: \x1b[1;{ansi}m{verdict}\x1b[0m"), format!("verdict: {verdict}\r"));
    for (no_color, expect) in [(false, &coloured), (true, &plain)] {
        let mut script = std::process::Command::new("script");
        script.args(["-qec", &again, "/dev/null"]).current_dir(repo()).stdin(std::process::Stdio::null());
        if no_color {
            script.env("NO_COLOR", "1");
        } else {
            script.env_remove("NO_COLOR");
        }
        let out = script.output().unwrap();
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(shown.contains(expect.as_str()), "NO_COLOR {no_color}: {shown}");
        let rules = shown.lines().skip_while(|l| !l.starts_with("  R1 ")).take_while(|l| !l.starts_with("report: "));
        for line in rules {
            assert!(line.trim_end_matches('\r').chars().count() <= 70, "on a 70-column terminal: {line:?}");
        }
    }

    let report = cand_dir.join("report.html");
    let index = bench.path().join("reports/index.html");
    let html = std::fs::read_to_string(&report).unwrap();
    // The family table: the reference's figures beside the candidate's, per family.
    let families = &html[html.find(r#"<table id="family-asr">"#).unwrap()..];
    let families = &families[..families.find("</table>").unwrap()];
    assert!(families.contains(&format!("<th>{CAND} (candidate)</th><th>{BASE} (reference)</th>")), "{families}");
    for row in families.split("<tr>").skip(2) {
        assert_eq!(row.matches("<b>").count(), 2, "a figure of each run: {row}");
    }
    // The index: the reference as "reference", the candidate as its verdict.
    let ihtml = std::fs::read_to_string(&index).unwrap();
    let latest = &ihtml[ihtml.find(r#"id="latest""#).unwrap()..ihtml.find("<h2>Plan").unwrap()];
    let row_of = |v: &str| latest.split("<tr ").find(|r| r.contains(&format!("<td>{v}</td>"))).unwrap().to_string();
    assert!(
        row_of(BASE).contains(r#"class="vb v-reference""#) && !row_of(BASE).contains("rejected<"),
        "{}",
        row_of(BASE)
    );
    assert!(row_of(CAND).contains(&format!(r#"<span class="vb v-{verdict}">{verdict}</span>"#)), "{}", row_of(CAND));

    let chromium = Chromium::find();
    // Every bar is seen, a 0 % one too (the candidate's are all 0 %): drawn at least 2 px wide.
    let bars = "<script>window.addEventListener('load',function(){var w=[].slice.call(document.querySelectorAll('#asr-suite g.bar,#asr-injection g.bar')).map(function(g){return Math.max.apply(null,[].slice.call(g.querySelectorAll('rect')).map(function(r){return r.getBoundingClientRect().width}))});document.title=JSON.stringify(w)})</script>";
    let widths = eval_page(&chromium, &report, 1280, bars);
    let widths: Vec<f64> = widths.as_array().unwrap().iter().map(|w| w.as_f64().unwrap()).collect();
    assert!(widths.len() >= 8, "{widths:?}");
    assert!(widths.iter().all(|w| *w >= 2.0), "a bar narrower than 2 px: {widths:?}");
    // One colour per verdict: the report's badge and the index's are the same; the
    // candidate's line in the index is the report's blue, the reference's grey, and no
    // line or marker wears a verdict's colour.
    let verdict_bg = "<script>window.addEventListener('load',function(){document.title=JSON.stringify(getComputedStyle(document.getElementById('verdict')).backgroundColor)})</script>";
    let in_report = eval_page(&chromium, &report, 1280, verdict_bg);
    let looks = "<script>window.addEventListener('load',function(){var cs=function(e,p){return getComputedStyle(e)[p]};var badge=function(v){var tr=[].slice.call(document.querySelectorAll('#latest tr')).find(function(r){return r.cells[0]&&r.cells[0].textContent===v});return cs(tr.querySelector('.vb'),'backgroundColor')};var line=function(v){var i=[].slice.call(document.querySelectorAll('#vf-bar label')).findIndex(function(l){return l.textContent===v});var g='#trends svg.chart g.ver-'+i+' .pt ';return cs(document.querySelector(g+'circle:not([fill=transparent]),'+g+'rect,'+g+'polygon'),'fill')};var painted=[].slice.call(document.querySelectorAll('#trends svg.chart g[class^=ver-] *')).map(function(e){return [cs(e,'stroke'),cs(e,'fill')]});document.title=JSON.stringify({cand:badge('CAND'),ref:badge('BASE'),cand_line:line('CAND'),ref_line:line('BASE'),painted:painted})})</script>"
        .replace("CAND", CAND)
        .replace("BASE", BASE);
    let seen = eval_page(&chromium, &index, 1280, &looks);
    assert_eq!(seen["cand"], in_report, "the candidate's verdict in one colour: {seen}");
    assert!(!VERDICT_RGB.contains(&seen["ref"].as_str().unwrap()), "the reference's badge is no verdict's: {seen}");
    assert_eq!(seen["cand_line"], CANDIDATE_RGB, "{seen}");
    let (r, g, b) = rgb(seen["ref_line"].as_str().unwrap());
    assert!((r - g).abs() < 1.0 && (g - b).abs() < 1.0, "the reference's line grey: {seen}");
    for pair in seen["painted"].as_array().unwrap() {
        for colour in pair.as_array().unwrap() {
            assert!(!VERDICT_RGB.contains(&colour.as_str().unwrap()), "a line in a verdict's colour: {colour}");
        }
    }
    for width in [1280, 420] {
        for page in [&report, &index] {
            let (findings, errors) = probe(&chromium, page, width);
            assert!(
                errors.is_empty() && findings.is_empty(),
                "{} at {width} px: {errors:?}\n{}",
                page.display(),
                findings.join("\n")
            );
        }
    }
}

/// Two runs with an adaptive campaign: the report draws the budget curve (no table of
/// K columns), the compare page and the index show the adaptive and transfer ASR with
/// their bounds, and what the attacker wrote is shown with its invisible characters
/// named, never raw.
#[test]
fn adaptive_runs_draw_their_budget_curve_and_compare_and_index_show_the_adaptive_asr() {
    let bench = Bench::new();
    // The attacker tests' known-truth target — weak to three phrases of the simulated
    // attacker's, which no grammar wording has — a robust one, and their plan: eight
    // banking pairs (four searched, four held out), ten attempts a pair.
    use crate::attacker::{WEAK, plan, version};
    bench.write("versions/weak.toml", &version(WEAK));
    bench.write("versions/robust.toml", &version("susceptibility = 0.0"));
    bench.write("profiles/attacker-mini.toml", &plan("proposer = \"model\""));
    // Folders named, so the runs' seeds (and the search) are the same every time.
    let run = |version: &str| {
        let dir = bench.path().join(format!("reports/{version}/attacker-mini/run-{version}"));
        let run = bench.run(&["run", version, "--plan", "attacker-mini", "--out", dir.to_str().unwrap()]);
        assert!(matches!(run.code, Some(0 | 10 | 11)), "{version}: {}\n{}", run.stdout, run.stderr);
        dir
    };
    let (robust, weak) = (run("robust"), run("weak"));
    let r2 = |dir: &Path| {
        let j = json(&dir.join("judgement.json"));
        j["rules"].as_array().unwrap().iter().find(|r| r["id"] == "R2").unwrap()["measured"]["adaptive"].clone()
    };
    let (ar, aw) = (r2(&robust), r2(&weak));
    assert!(aw["broken"].as_u64() > Some(0) && aw["transfer"]["broken"].as_u64() > Some(0), "{aw}");
    assert_eq!(ar["transfer"]["broken"], 0, "{ar}");

    // The report: the curve drawn, its numbers folded, a row per change.
    let report = weak.join("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains(r#"<svg class="chart" id="budget-curve-chart""#), "the curve is drawn");
    let numbers = &html[html.find(r#"<details id="budget-curve-numbers">"#).expect("the numbers folded")..];
    let numbers = &numbers[..numbers.find("</details>").unwrap()];
    assert!(numbers.matches("<tr>").count() <= 1 + 4 + 1, "a row per change of 4 pairs: {numbers}");
    assert!(html.contains(">R2 ≤ 5.0 %<") && html.contains(">transfer "), "the limit and the transfer across");

    // Compare: the adaptive and the transfer ASR of both runs, with their bounds.
    let page = bench.run(&["compare", robust.to_str().unwrap(), weak.to_str().unwrap()]).ok();
    let page = PathBuf::from(page.stdout.lines().last().unwrap());
    let chtml = std::fs::read_to_string(&page).unwrap();
    let figures = &chtml[chtml.find(r#"<table id="figures">"#).unwrap()..];
    let figures = &figures[..figures.find("</table>").unwrap()];
    for (label, a, b) in
        [("adaptive ASR, search pairs", &ar, &aw), ("transfer ASR, held-out pairs", &ar["transfer"], &aw["transfer"])]
    {
        let row =
            &figures[figures.find(&format!("<td>{label}</td>")).unwrap_or_else(|| panic!("{label}: {figures}"))..];
        let row = &row[..row.find("</tr>").unwrap()];
        for f in [a, b] {
            let count = format!("({}/{}) [", f["broken"], f["pairs"]);
            assert!(row.contains(&count), "{label}: {count} in {row}");
        }
    }
    assert!(chtml.contains(">adaptive ASR, search pairs<"), "in the chart too");

    // The index: the adaptive figures' trends beside the fixed held-out ASR, a point per
    // run linking its report, the adaptive maximum drawn on the transfer figure.
    let ihtml = std::fs::read_to_string(bench.path().join("reports/index.html")).unwrap();
    for id in ["trend-attacker-mini-transfer", "trend-attacker-mini-adaptive"] {
        let at = ihtml.find(&format!(r#"id="{id}""#)).unwrap_or_else(|| panic!("no chart {id}"));
        let chart = &ihtml[at..at + ihtml[at..].find("</svg>").unwrap()];
        assert_eq!(chart.matches(r#"<a class="pt" href="#).count(), 2, "{id}: a point per run");
        assert_eq!(chart.contains(">R2 ≤ 5 %<"), id.ends_with("transfer"), "{id}: the limit where it holds");
    }

    // What the attacker wrote, with invisible characters and separators in it: named
    // on the page, never raw.
    let hidden =
        ['\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}', '\u{feff}', '\u{202e}', '\u{2066}', '\u{2028}', '\u{2029}'];
    let mut log = json(&weak.join("adaptive.json"));
    let sneaky: String = hidden.iter().map(|c| format!("ign{c}ore")).collect();
    let template = log["frozen"][0]["proposal"]["template"].as_str().unwrap().to_string();
    log["frozen"][0]["proposal"]["template"] = serde_json::Value::from(format!("{sneaky} {template}"));
    std::fs::write(weak.join("adaptive.json"), serde_json::to_string_pretty(&log).unwrap()).unwrap();
    let judged = bench.run(&["judge", weak.to_str().unwrap()]);
    assert!(matches!(judged.code, Some(0 | 10 | 11)), "{}\n{}", judged.stdout, judged.stderr);
    let html = std::fs::read_to_string(&report).unwrap();
    for c in hidden {
        assert!(!html.contains(c), "U+{:04X} raw in the report", c as u32);
    }
    let chromium = Chromium::find();
    let shown = "<script>window.addEventListener('load',function(){document.title=JSON.stringify(document.querySelector('#found-templates pre.template').textContent)})</script>";
    let shown = eval_page(&chromium, &report, 1280, shown);
    let shown = shown.as_str().unwrap();
    for c in hidden {
        assert!(shown.contains(&format!("ign⟨U+{:04X}⟩ore", c as u32)), "U+{:04X} named: {shown:?}", c as u32);
    }
    for width in [1280, 420] {
        for p in [&report, &page, &bench.path().join("reports/index.html")] {
            let (findings, errors) = probe(&chromium, p, width);
            assert!(
                errors.is_empty() && findings.is_empty(),
                "{} at {width} px: {errors:?}\n{}",
                p.display(),
                findings.join("\n")
            );
        }
    }
}
