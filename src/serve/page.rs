//! `serve`'s live page, `/`: one self-contained HTML page (inline CSS and one inline
//! script, allowed by its hash like the reports' own) that opens `EventSource('/events')`
//! and fills in the daemon's line, the running job's progress (a training job's steps,
//! loss and ETA while it trains) and the queue from the `status` and `jobs` events —
//! with `textContent` only, never markup from data. The page itself holds no data, so
//! it is the same bytes every time. A job's state is
//! written in grey (running and failed stand out); its verdict carries the colour, the
//! reports' own (`pruefstand_report::colours`). Not the feed
//! (`serve::live`) nor the files (`serve::files`).

use std::sync::LazyLock;

use pruefstand_report::sha256_base64;

const CSS: &str = r#"
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem auto;max-width:1100px;padding:0 1rem;color:#222}
h1{font-size:1.4rem;margin:0 0 .3rem} h2{font-size:1.1rem;margin-top:1.6rem;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:.9rem} a{color:#1565c0}
#conn{font-size:.8rem;border-radius:.25rem;padding:0 .4rem;color:#fff;background:#9e9e9e} #conn.live{background:#1565c0}
#line{font-size:1.05rem;margin:.6rem 0;overflow-wrap:anywhere}
#job{border:1px solid #ddd;border-radius:.4rem;padding:.6rem .8rem;margin:.6rem 0}
#job h3{margin:0;font-size:1rem;overflow-wrap:anywhere} #job-run{margin:.1rem 0 .4rem;overflow-wrap:anywhere}
progress{width:100%;height:1.2rem} dl{display:flex;flex-wrap:wrap;gap:.2rem 1.6rem;margin:.4rem 0 0} dt{color:#555;font-size:.8rem} dd{margin:0;font-weight:700}
.scroll{overflow-x:auto;max-width:100%} table{border-collapse:collapse;font-size:.9rem;width:100%} td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;vertical-align:top}
td.r{text-align:right} .st{white-space:nowrap;color:#555} .st-running{color:#1565c0;font-weight:700} .st-failed{color:#c62828;font-weight:700}
.err{color:#c62828;font-size:.85rem;overflow-wrap:anywhere}
@media (max-width:600px){.wide{display:none} body{margin:.8rem auto} td,th{padding:.2rem .3rem}}
"#;

const BODY: &str = r#"<h1>pruefstand <span id="conn">connecting…</span></h1>
<p class="meta">A read-only view of this bench: <a id="index" href="/reports/index.html" hidden>the trend index</a> <span id="noindex">no trend index yet</span> · <a href="/reports/">reports/</a> · <a href="/api/status">status JSON</a> · <a href="/api/queue">queue JSON</a></p>
<p id="line">waiting for the daemon's state…</p>
<p id="paused" class="err" hidden>The queue is paused: no job starts until <code>pruefstand resume</code>.</p>
<section id="job" hidden><h3 id="job-title"></h3><p id="job-run" class="meta"></p><p id="job-train" class="meta" hidden></p><progress id="bar" max="1" value="0"></progress>
<dl><div id="cases-box"><dt>cases done</dt><dd><span id="done">0</span> / <span id="total">0</span></dd></div><div id="steps-box" hidden><dt>steps done</dt><dd><span id="step">0</span> / <span id="steps">?</span></dd></div><div id="loss-box" hidden><dt>loss</dt><dd id="loss">–</dd></div><div id="errors-box"><dt>errors</dt><dd id="errors">–</dd></div><div><dt>ETA</dt><dd id="eta">–</dd></div><div id="shards-box" hidden><dt>shards</dt><dd id="shards"></dd></div></dl></section>
<h2>Queue <span class="meta">(<span id="pending">0</span> pending)</span></h2>
<div class="scroll"><table><thead><tr><th>job</th><th>state</th><th>version</th><th class="wide">plan</th><th>progress / verdict</th><th class="wide">started</th><th class="wide">finished</th><th>report</th></tr></thead><tbody id="jobs"><tr><td colspan="8">no jobs</td></tr></tbody></table></div>
<noscript><p>This page follows the daemon with a small script; without it see <a href="/api/status">/api/status</a> and <a href="/reports/">/reports/</a>.</p></noscript>"#;

const SCRIPT: &str = r#"(function(){"use strict";
var $=function(id){return document.getElementById(id);};
var events=0,running=null,train=null;
function mark(){events+=1;document.body.setAttribute("data-events",String(events));}
function when(t){if(!t)return "";var d=new Date(t);if(isNaN(d.getTime()))return t;var p=function(n){return (n<10?"0":"")+n;};return p(d.getMonth()+1)+"-"+p(d.getDate())+" "+p(d.getHours())+":"+p(d.getMinutes());}
function cell(tr,text,cls){var td=document.createElement("td");td.textContent=text==null?"":String(text);if(cls)td.className=cls;tr.appendChild(td);return td;}
function progressText(){if(!running)return "";if(train&&train.in_progress)return train.steps==null?"training":"step "+train.step+" / "+train.steps;return running.done+" / "+running.total+" cases";}
function onStatus(d){
 $("line").textContent=d.line;
 var s=d.status,st=s&&s.state;
 running=(s&&s.daemon==="running"&&st&&st.state==="running")?st:null;
 train=(running&&d.training&&d.training.job===running.job)?d.training:null;
 $("job").hidden=!running;
 if(running){
  var stepping=!!(train&&train.in_progress);
  $("job-title").textContent="job "+running.job+": "+running.version+" on "+running.plan;
  $("job-run").textContent=d.run?(d.reference?"its reference first: ":"run ")+d.run:"";
  $("job-train").hidden=!train;$("job-train").textContent=train?train.line:"";
  $("cases-box").hidden=stepping;$("errors-box").hidden=stepping;$("steps-box").hidden=!stepping;$("loss-box").hidden=!stepping;
  if(stepping){
   $("bar").max=Math.max(train.steps||0,1);$("bar").value=train.step;
   $("step").textContent=String(train.step);$("steps").textContent=train.steps==null?"?":String(train.steps);
   $("loss").textContent=train.loss==null?"–":train.loss;
   $("eta").textContent=train.eta==null?"–":train.eta;
  }else{
   $("bar").max=Math.max(running.total,1);$("bar").value=running.done;
   $("eta").textContent=d.eta==null?"–":d.eta;
  }
  $("done").textContent=String(running.done);$("total").textContent=String(running.total);
  $("errors").textContent=d.errors==null?"–":String(d.errors);
  $("shards-box").hidden=!d.shards;$("shards").textContent=d.shards||"";
 }
 $("pending").textContent=s?String(s.pending):"?";
 $("paused").hidden=!(s&&s.paused);
 var cellNow=document.querySelector("td[data-running]");
 if(cellNow)cellNow.textContent=progressText();
 mark();
}
function onJobs(d){
 var body=$("jobs"),rows=[];
 d.jobs.forEach(function(j){
  var tr=document.createElement("tr");
  cell(tr,j.id,"r");cell(tr,j.state,"st st-"+j.state);cell(tr,j.version);cell(tr,j.plan,"wide");
  var p=cell(tr,"");
  if(j.state==="running"){p.setAttribute("data-running",String(j.id));p.textContent=running&&running.job===j.id?progressText():"running";}
  else if(j.verdict){var v=document.createElement("span");v.textContent=j.verdict;v.className="vb v-"+j.verdict;if(j.summary)v.title=j.summary;p.appendChild(v);}
  else if(j.error){p.textContent=j.error;p.className="err";}
  if(j.training&&j.state!=="running"){var t=document.createElement("div");t.className="meta";t.textContent="training: "+j.training;p.appendChild(t);}
  cell(tr,when(j.started),"wide");cell(tr,when(j.finished),"wide");
  var r=cell(tr,"");
  if(j.report){var a=document.createElement("a");a.href=j.report;a.textContent="report";r.appendChild(a);}
  rows.push(tr);
 });
 if(!rows.length){var tr=document.createElement("tr");cell(tr,"no jobs").colSpan=8;rows.push(tr);}
 body.replaceChildren.apply(body,rows);
 $("index").hidden=!d.index;$("noindex").hidden=!!d.index;
 mark();
}
var source=new EventSource("/events");
source.addEventListener("status",function(e){onStatus(JSON.parse(e.data));});
source.addEventListener("jobs",function(e){onJobs(JSON.parse(e.data));});
source.onopen=function(){$("conn").textContent="live";$("conn").className="live";};
source.onerror=function(){$("conn").textContent="reconnecting…";$("conn").className="";};
})();"#;

/// The page's policy (sent as the header and in the page): as the reports', plus
/// `connect-src 'self'` for `/events`.
pub(super) static CSP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; script-src 'sha256-{}'; connect-src 'self'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'",
        sha256_base64(SCRIPT.as_bytes())
    )
});

/// The page, the same bytes on every request.
pub(super) static PAGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"Content-Security-Policy\" content=\"{}\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>pruefstand — live</title><style>{CSS}{}</style></head><body>\n{BODY}\n<script>{SCRIPT}</script></body></html>\n",
        *CSP,
        pruefstand_report::colours::css()
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_allows_its_own_script_only_and_puts_no_data_into_markup() {
        assert!(PAGE.contains(&format!("content=\"{}\"", *CSP)));
        assert!(CSP.contains(&sha256_base64(SCRIPT.as_bytes())));
        assert!(!CSP.contains("unsafe-inline'; connect") && !CSP.contains("script-src 'unsafe"));
        assert!(
            !SCRIPT.contains("innerHTML") && !SCRIPT.contains("outerHTML") && !SCRIPT.contains("insertAdjacentHTML")
        );
    }

    #[test]
    fn a_done_job_is_grey_and_its_verdict_wears_the_reports_colour() {
        use pruefstand_report::colours;
        // No verdict's colour on a job's state: "done" beside "rejected" never reads as
        // two verdicts.
        let states = &CSS[CSS.find(".st{").unwrap()..];
        let states = &states[..states.find('\n').unwrap()];
        assert!(!states.contains(".st-done"), "done is plain grey: {states}");
        assert!(!states.contains(colours::APPROVED) && !states.contains(colours::INCONCLUSIVE), "{states}");
        // Nor on the connection's badge: green is approved's.
        assert!(!CSS.contains(&format!("#conn.live{{background:{}", colours::APPROVED)));
        for (verdict, colour) in [("approved", colours::APPROVED), ("rejected", colours::REJECTED)] {
            assert!(PAGE.contains(&format!(".v-{verdict}{{background:{colour};color:#fff}}")), "{verdict}");
        }
        assert!(SCRIPT.contains(r#"v.className="vb v-"+j.verdict"#), "the verdict is a badge");
    }

    #[test]
    fn a_training_fills_the_fields_the_page_has() {
        // Every element the script writes a training's progress into is on the page.
        for id in ["job-train", "cases-box", "steps-box", "step", "steps", "loss-box", "loss", "errors-box", "eta"] {
            assert!(BODY.contains(&format!("id=\"{id}\"")), "{id}");
            assert!(SCRIPT.contains(&format!("$(\"{id}\")")), "{id}");
        }
    }
}
