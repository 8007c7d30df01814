//! The report's way into single cases: the case table (filters and sort by a small
//! inline script; without it every row is shown), the cases changed against the
//! reference, and one rendered conversation per case. Not for figures: those are the
//! charts' and the judge's.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write;

use super::html::esc;
use super::{compare, conversation};
use pruefstand_core::case::{CaseKind, CaseRecord};
use pruefstand_store::RunDir;

/// How a case differs from the reference's same case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    NewlyLanded,
    NewlyBlocked,
    UtilityLost,
    UtilityGained,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::NewlyLanded => "newly landed",
            Change::NewlyBlocked => "newly blocked",
            Change::UtilityLost => "utility lost",
            Change::UtilityGained => "utility gained",
        }
    }

    /// The changes from the reference's case `r` to this run's case `c`.
    pub fn between(c: &CaseRecord, r: &CaseRecord) -> Vec<Change> {
        let mut out = Vec::new();
        if c.kind == CaseKind::Attacked {
            match (r.security, c.security) {
                (Some(false), Some(true)) => out.push(Change::NewlyLanded),
                (Some(true), Some(false)) => out.push(Change::NewlyBlocked),
                _ => {}
            }
        }
        match (r.utility, c.utility) {
            (Some(true), Some(false)) => out.push(Change::UtilityLost),
            (Some(false), Some(true)) => out.push(Change::UtilityGained),
            _ => {}
        }
        out
    }
}

/// What the case table's filters select on; a case may carry several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    Landed,
    Blocked,
    FailedUtility,
    Error,
    Changed,
    // What the defences and the agent did (the record's counters; the conversation
    // marks where).
    Flagged,
    HumanAsked,
    HumanDenied,
    Malformed,
    UnknownTool,
    Overflow,
    Restarted,
}

impl Tag {
    const ALL: [Tag; 12] = [
        Tag::Landed,
        Tag::Blocked,
        Tag::FailedUtility,
        Tag::Error,
        Tag::Changed,
        Tag::Flagged,
        Tag::HumanAsked,
        Tag::HumanDenied,
        Tag::Malformed,
        Tag::UnknownTool,
        Tag::Overflow,
        Tag::Restarted,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Tag::Landed => "landed",
            Tag::Blocked => "blocked",
            Tag::FailedUtility => "failed-utility",
            Tag::Error => "error",
            Tag::Changed => "changed",
            Tag::Flagged => "flagged",
            Tag::HumanAsked => "human-asked",
            Tag::HumanDenied => "human-denied",
            Tag::Malformed => "malformed",
            Tag::UnknownTool => "unknown-tool",
            Tag::Overflow => "overflow",
            Tag::Restarted => "restarted",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Tag::Landed => "injection landed",
            Tag::Blocked => "injection blocked",
            Tag::FailedUtility => "failed utility",
            Tag::Error => "error",
            Tag::Changed => "changed vs reference",
            Tag::Flagged => "guardrail flagged",
            Tag::HumanAsked => "human asked",
            Tag::HumanDenied => "human denied",
            Tag::Malformed => "malformed output",
            Tag::UnknownTool => "unknown tool called",
            Tag::Overflow => "context overflow",
            Tag::Restarted => "restarted",
        }
    }

    fn of(r: &CaseRecord, changed: bool) -> Vec<Tag> {
        let mut tags = Vec::new();
        if r.is_error() {
            tags.push(Tag::Error);
        } else {
            if r.kind == CaseKind::Attacked {
                tags.push(if r.security == Some(true) { Tag::Landed } else { Tag::Blocked });
            }
            if r.utility == Some(false) {
                tags.push(Tag::FailedUtility);
            }
        }
        if changed {
            tags.push(Tag::Changed);
        }
        let some = |n: Option<u64>| n.is_some_and(|n| n > 0);
        for (tag, happened) in [
            (Tag::Flagged, some(r.guardrail_flags)),
            (Tag::HumanAsked, some(r.human_asks)),
            (Tag::HumanDenied, some(r.human_denials)),
            (Tag::Malformed, some(r.malformed_outputs)),
            (Tag::UnknownTool, some(r.unknown_tool_calls)),
            (Tag::Overflow, r.outcome() == pruefstand_core::case::Outcome::ContextOverflow),
            (Tag::Restarted, some(r.restarts)),
        ] {
            if happened {
                tags.push(tag);
            }
        }
        tags
    }
}

/// What the defences and the agent did in a case, as a short cell: "2 flagged, 1 denied".
fn events_cell(r: &CaseRecord) -> String {
    let mut parts = Vec::new();
    for (n, word) in [
        (r.guardrail_flags, "flagged"),
        (r.human_asks, "asked"),
        (r.human_denials, "denied"),
        (r.malformed_outputs, "malformed"),
        (r.unknown_tool_calls, "unknown tool"),
        (r.restarts, "restarted"),
    ] {
        if let Some(n) = n.filter(|n| *n > 0) {
            parts.push(format!("{n} {word}"));
        }
    }
    if r.outcome() == pruefstand_core::case::Outcome::ContextOverflow {
        parts.push("context overflow".into());
    }
    parts.join(", ")
}

/// A leading run of digits or of non-digits: (digits?, the run, the rest).
fn split_run(s: &str) -> (bool, &str, &str) {
    let digits = s.starts_with(|c: char| c.is_ascii_digit());
    let end = s.find(|c: char| c.is_ascii_digit() != digits).unwrap_or(s.len());
    (digits, &s[..end], &s[end..])
}

/// Orders task names as people count: `user_task_2` before `user_task_10`.
pub(crate) fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.is_empty(), b.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let ((da, pa, ra), (db, pb, rb)) = (split_run(a), split_run(b));
        let ord = if da && db {
            let (ta, tb) = (pa.trim_start_matches('0'), pb.trim_start_matches('0'));
            ta.len().cmp(&tb.len()).then(ta.cmp(tb)).then(pa.len().cmp(&pb.len()))
        } else {
            pa.cmp(pb)
        };
        if ord != Ordering::Equal {
            return ord;
        }
        (a, b) = (ra, rb);
    }
}

/// The cases in the order the report lists them (suite, user task, injection task,
/// attack; numbers counted), each with its anchor `case-N`.
pub fn ordered(records: &[CaseRecord]) -> Vec<&CaseRecord> {
    let mut out: Vec<&CaseRecord> = records.iter().collect();
    let key = |r: &CaseRecord| {
        [
            r.suite.clone(),
            r.user_task.clone().unwrap_or_default(),
            r.injection_task.clone().unwrap_or_default(),
            r.attack.clone().unwrap_or_default(),
        ]
    };
    out.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        ka.iter().zip(&kb).map(|(x, y)| natural_cmp(x, y)).find(|o| o.is_ne()).unwrap_or(Ordering::Equal)
    });
    out
}

/// Each case id's anchor in the page.
pub fn anchors(ordered: &[&CaseRecord]) -> BTreeMap<String, String> {
    ordered.iter().enumerate().map(|(i, r)| (r.case_id.clone(), format!("case-{i}"))).collect()
}

fn yes_no(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "–",
    }
}

fn kind_word(k: CaseKind) -> &'static str {
    match k {
        CaseKind::Clean => "clean",
        CaseKind::Attacked => "attacked",
        CaseKind::InjectionGoal => "injection goal",
    }
}

/// The "changed against the reference" view: counts per change, then the changed
/// cases. `changes` holds only cases with at least one change.
/// Where the changed view finds both sides' conversations.
pub(crate) struct Sides<'a> {
    /// This run's directory (None: a report built in memory, no conversations).
    pub run_dir: Option<&'a RunDir>,
    pub reference: Option<&'a pruefstand_judge::ReferenceRun>,
    /// The bytes each conversation may take.
    pub room: usize,
}

pub(crate) fn changed_view(
    b: &mut String,
    reference: Option<&str>,
    changes: &BTreeMap<String, Vec<Change>>,
    anchors: &BTreeMap<String, String>,
    records: &[CaseRecord],
    sides: &Sides,
) {
    b.push_str(r#"<h2 id="changed">Changed against the reference</h2>"#);
    let Some(reference) = reference else {
        b.push_str(r#"<p class="note">No reference run: nothing to compare.</p>"#);
        return;
    };
    let mut counts: BTreeMap<Change, usize> = BTreeMap::new();
    for c in changes.values().flatten() {
        *counts.entry(*c).or_default() += 1;
    }
    let summary: Vec<String> = [Change::NewlyLanded, Change::NewlyBlocked, Change::UtilityLost, Change::UtilityGained]
        .iter()
        .map(|c| format!("<b>{}</b> {}", counts.get(c).copied().unwrap_or(0), c.as_str()))
        .collect();
    let _ = write!(
        b,
        r#"<p id="changed-summary">Against {} (cases without error on both sides): {}.</p>"#,
        esc(reference),
        summary.join(" · ")
    );
    if changes.is_empty() {
        return;
    }
    b.push_str(
        r#"<div class="scroll"><table id="changed-cases"><thead><tr><th>case</th><th>change</th></tr></thead><tbody>"#,
    );
    let mut rows: Vec<(&String, &Vec<Change>)> = changes.iter().collect();
    rows.sort_by(|a, b| a.1.cmp(b.1).then_with(|| natural_cmp(a.0, b.0)));
    for (id, list) in rows {
        let words: Vec<&str> = list.iter().map(|c| c.as_str()).collect();
        let link = anchors.get(id).map(|a| format!(r##"<a href="#{a}">{}</a>"##, esc(id))).unwrap_or_else(|| esc(id));
        let _ = write!(b, r#"<tr><td>{link}</td><td>{}</td></tr>"#, words.join(", "));
    }
    b.push_str("</tbody></table></div>");
    side_by_side(b, changes, records, sides);
}

/// Each changed case with the reference's conversation beside the candidate's.
fn side_by_side(b: &mut String, changes: &BTreeMap<String, Vec<Change>>, records: &[CaseRecord], sides: &Sides) {
    let Some(reference) = sides.reference else { return };
    let theirs: BTreeMap<&str, &CaseRecord> = reference.records.iter().map(|r| (r.case_id.as_str(), r)).collect();
    let ours: BTreeMap<&str, &CaseRecord> = records.iter().map(|r| (r.case_id.as_str(), r)).collect();
    // The reference's traces as links from this page (None: not reachable as a path).
    let href = sides
        .run_dir
        .zip(reference.dir.as_ref())
        .and_then(|(here, there)| {
            Some((std::path::absolute(here.path()).ok()?, std::path::absolute(there.path()).ok()?))
        })
        .and_then(|(here, there)| compare::relative_dir(&here, &there));
    let mut rows: Vec<(&String, &Vec<Change>)> = changes.iter().collect();
    rows.sort_by(|a, b| a.1.cmp(b.1).then_with(|| natural_cmp(a.0, b.0)));
    b.push_str(
        r#"<p class="note">Each changed case: the reference's conversation on the left, this run's on the right.</p>"#,
    );
    for (i, (id, list)) in rows.into_iter().enumerate() {
        let (Some(cand), Some(refr)) = (ours.get(id.as_str()), theirs.get(id.as_str())) else { continue };
        let words: Vec<&str> = list.iter().map(|c| c.as_str()).collect();
        let reference_label = format!("reference: {}", reference.version);
        let html = compare::side_by_side(
            &compare::Side {
                label: "this run",
                run_dir: sides.run_dir,
                href_base: Some(""),
                record: cand,
                room: sides.room,
            },
            &compare::Side {
                label: &reference_label,
                run_dir: reference.dir.as_ref(),
                href_base: href.as_deref(),
                record: refr,
                room: sides.room,
            },
        );
        let _ = write!(
            b,
            r#"<details class="case pair" id="changed-{i}"><summary><code>{}</code> — {}</summary>{html}</details>"#,
            esc(id),
            words.join(", ")
        );
    }
}

/// The case table with its filters (shown only when the script runs).
pub fn table(
    b: &mut String,
    ordered: &[&CaseRecord],
    changes: &BTreeMap<String, Vec<Change>>,
    anchors: &BTreeMap<String, String>,
) {
    b.push_str(r#"<h2 id="cases-h">Cases</h2><form id="case-filter" hidden><p><label><input type="radio" name="f" value="all" checked> all</label>"#);
    for t in Tag::ALL {
        let _ = write!(b, r#" <label><input type="radio" name="f" value="{}"> {}</label>"#, t.as_str(), t.label());
    }
    let options = |values: Vec<&str>| -> String {
        let mut values = values;
        values.sort_by(|a, b| natural_cmp(a, b));
        values.dedup();
        values.iter().map(|v| format!(r#"<option value="{0}">{0}</option>"#, esc(v))).collect()
    };
    let suites = options(ordered.iter().map(|r| r.suite.as_str()).collect());
    let families = options(ordered.iter().filter_map(|r| r.attack.as_deref()).map(family_of).collect());
    let _ = write!(
        b,
        r#"</p><p><label>suite <select name="suite"><option value="">all</option>{suites}</select></label> <label>attack family <select name="family"><option value="">all</option>{families}</select></label> <label>search <input type="search" name="q" placeholder="case id, error, …"></label> <span id="case-count" class="note"></span></p></form><p class="note">{} cases; click a column head to sort, a case for its conversation.</p><div class="scroll"><table id="cases"><thead><tr><th>case</th><th>kind</th><th>utility</th><th>injection landed</th><th>outcome</th><th>vs reference</th><th>defences and agent</th><th>error</th><th>s</th><th>calls</th><th>tokens</th></tr></thead><tbody>"#,
        ordered.len()
    );
    for r in ordered {
        let change = changes.get(&r.case_id);
        let tags: Vec<&str> = Tag::of(r, change.is_some()).into_iter().map(Tag::as_str).collect();
        let changed: Vec<&str> = change.into_iter().flatten().map(|c| c.as_str()).collect();
        let num = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "–".into());
        let _ = write!(
            b,
            r##"<tr data-tags="{}" data-suite="{}" data-family="{}"><td><a href="#{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td></tr>"##,
            tags.join(" "),
            esc(&r.suite),
            esc(r.attack.as_deref().map(family_of).unwrap_or("")),
            anchors[&r.case_id],
            esc(&r.case_id),
            kind_word(r.kind),
            yes_no(r.utility),
            yes_no(r.security),
            r.outcome().as_str(),
            changed.join(", "),
            esc(&events_cell(r)),
            esc(r.error.as_deref().unwrap_or("")),
            r.duration_s,
            num(r.llm_calls),
            num(r.tokens()),
        );
    }
    b.push_str("</tbody></table></div>");
}

/// The attack family an attack belongs to (its own name when it is in none).
fn family_of(attack: &str) -> &str {
    pruefstand_core::family::of_attack(attack).unwrap_or(attack)
}

/// One collapsed conversation per case, in table order, each with the verdict of that
/// case on top.
pub fn conversations(
    b: &mut String,
    run_dir: Option<&RunDir>,
    ordered: &[&CaseRecord],
    changes: &BTreeMap<String, Vec<Change>>,
    anchors: &BTreeMap<String, String>,
    room: usize,
) {
    b.push_str(r#"<h2 id="conversations">Conversations</h2><p class="note">Injected text in tool results is <mark>highlighted</mark>; long tool results are shortened around it.</p>"#);
    for r in ordered {
        let verdict = if r.is_error() {
            format!("error: {}", r.error.as_deref().unwrap_or("?"))
        } else {
            let landed = if r.kind == CaseKind::Attacked {
                format!(", injection landed: {}", yes_no(r.security))
            } else {
                String::new()
            };
            format!("{}: utility {}{landed}", kind_word(r.kind), yes_no(r.utility))
        };
        let changed: Vec<&str> = changes.get(&r.case_id).into_iter().flatten().map(|c| c.as_str()).collect();
        let changed =
            if changed.is_empty() { String::new() } else { format!(" · vs reference: {}", changed.join(", ")) };
        let _ = write!(
            b,
            r#"<details class="case" id="{}"><summary><code>{}</code> — {}{}</summary>"#,
            anchors[&r.case_id],
            esc(&r.case_id),
            esc(&verdict),
            esc(&changed)
        );
        let body = conversation::of_case(run_dir, r, room);
        b.push_str(&body);
        if let Some(href) = r.trace.as_deref().and_then(super::html::safe_href) {
            let _ = write!(b, r#"<p class="note"><a href="{href}">raw trace (AgentDojo JSON)</a></p>"#);
        }
        b.push_str("</details>");
    }
}

/// The page's only script: filters and sort for the case table, and a conversation
/// opened when a link (a heat-map cell, a case id) points at it. No data inside.
pub const SCRIPT: &str = r#"(function(){
var t=document.getElementById('cases');if(!t)return;
var body=t.tBodies[0],rows=[].slice.call(body.rows),f=document.getElementById('case-filter'),n=document.getElementById('case-count');
function count(){n.textContent=rows.filter(function(r){return !r.hidden}).length+' of '+rows.length+' shown'}
function apply(){var v=f.querySelector('input:checked').value,s=f.elements.suite.value,fa=f.elements.family.value,q=f.elements.q.value.trim().toLowerCase();
rows.forEach(function(r){r.hidden=(v!=='all'&&(' '+r.getAttribute('data-tags')+' ').indexOf(' '+v+' ')<0)||(s&&r.getAttribute('data-suite')!==s)||(fa&&r.getAttribute('data-family')!==fa)||(q&&r.textContent.toLowerCase().indexOf(q)<0)});count()}
f.hidden=false;
f.addEventListener('change',apply);f.addEventListener('input',apply);f.addEventListener('submit',function(e){e.preventDefault()});
[].forEach.call(t.tHead.rows[0].cells,function(th,i){th.className='sort';th.addEventListener('click',function(){
var d=th.getAttribute('data-dir')==='asc'?-1:1;th.setAttribute('data-dir',d>0?'asc':'desc');
rows.sort(function(a,b){return d*a.cells[i].textContent.localeCompare(b.cells[i].textContent,undefined,{numeric:true})});
rows.forEach(function(r){body.appendChild(r)})})});
function open(){var e=location.hash&&document.getElementById(location.hash.slice(1));if(e&&e.tagName==='DETAILS'){e.open=true;e.scrollIntoView()}}
window.addEventListener('hashchange',open);open();count();
})();"#;

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::case::Case;

    #[test]
    fn natural_order_counts_numbers() {
        let mut v = vec!["user_task_10", "user_task_2", "user_task_1", "a", "user_task_02"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["a", "user_task_1", "user_task_2", "user_task_02", "user_task_10"]);
        assert_eq!(natural_cmp("x9", "x10"), Ordering::Less);
        assert_eq!(natural_cmp("b", "a10"), Ordering::Greater);
    }

    fn attacked(security: Option<bool>, utility: Option<bool>) -> CaseRecord {
        let case = Case {
            id: "s/u/a/i".into(),
            kind: CaseKind::Attacked,
            suite: "s".into(),
            user_task: Some("u".into()),
            injection_task: Some("i".into()),
            attack: Some("a".into()),
        };
        CaseRecord::of(&case, utility, security)
    }

    #[test]
    fn changes_name_flips_of_security_and_utility() {
        let c = |s, u| attacked(s, u);
        assert_eq!(Change::between(&c(Some(true), Some(true)), &c(Some(false), Some(true))), [Change::NewlyLanded]);
        assert_eq!(
            Change::between(&c(Some(false), Some(false)), &c(Some(true), Some(true))),
            [Change::NewlyBlocked, Change::UtilityLost]
        );
        assert_eq!(Change::between(&c(Some(true), Some(true)), &c(Some(true), Some(false))), [Change::UtilityGained]);
        assert!(Change::between(&c(Some(true), None), &c(Some(true), Some(true))).is_empty());
    }

    #[test]
    fn tags_select_what_the_filters_name() {
        let r = attacked(Some(true), Some(false));
        assert_eq!(Tag::of(&r, true), [Tag::Landed, Tag::FailedUtility, Tag::Changed]);
        let mut e = attacked(None, None);
        e.error = Some("timeout".into());
        e.outcome = Some(pruefstand_core::case::Outcome::Error);
        assert_eq!(Tag::of(&e, false), [Tag::Error]);
    }
}
