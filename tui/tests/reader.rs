//! The run-folder reader on rows that arrive in pieces: a torn last line waits for its end,
//! malformed rows are skipped, a rewritten file (resume, rollback) rebuilds the state, and a
//! missing folder is a clear error.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use qdarts_tui::state::RunStatus;
use qdarts_tui::{DashboardError, RunReader};

const METRICS: &str = "epoch,step,phase,loss,top1,lr,arch_lr,seconds\n";

fn scratch(name: &str) -> PathBuf {
    let d = qdarts_record::scratch::scratch(&format!("tui-{name}"));
    std::fs::write(d.join("config.toml"), "name = \"t\"\n[search]\nepochs = 2\n").unwrap();
    d
}

fn append(path: &std::path::Path, text: &str) {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
}

#[test]
fn a_torn_last_line_waits_for_its_end() {
    let d = scratch("torn");
    let m = d.join("metrics.csv");
    append(&m, METRICS);
    append(&m, "0,1,train,2.30,0.1,0.025,0.01,1.0\n0,2,tra");
    let mut r = RunReader::open(&d).unwrap();
    assert!(r.poll().unwrap());
    assert_eq!(r.state().train.len(), 1);
    // The writer finishes the row, and writes half of the next header-less row.
    append(&m, "in,2.10,0.2,0.025,0.01,2.0\n0,3,train,2.0");
    assert!(r.poll().unwrap());
    assert_eq!(r.state().train.len(), 2);
    assert_eq!(r.state().train[1].loss, 2.10);
    assert_eq!(r.state().skipped_rows, 0);
    // Nothing new: no change.
    assert!(!r.poll().unwrap());
    append(&m, "5,0.3,0.025,0.01,3.0\n");
    r.poll().unwrap();
    assert_eq!(r.state().train.len(), 3);
    assert_eq!(r.state().steps_per_sec(), Some(1.0));
}

#[test]
fn malformed_rows_are_skipped_and_counted() {
    let d = scratch("malformed");
    let m = d.join("metrics.csv");
    append(&m, METRICS);
    append(&m, "0,1,train,2.3,0.1,0.025,0.01,1.0\n");
    append(&m, "0,2,train,not-a-number,0.1,0.025,0.01,2.0\n");
    append(&m, "0,3,train,2.1\n");
    append(&m, "0,\"open quote,train,2.1,0.1,0.025,0.01,3.0\n");
    append(&m, "0,4,train,2.0,0.1,0.025,0.01,4.0\n");
    // Well-formed but impossible: top-1 of −500 %, a negative or NaN learning rate.
    append(&m, "0,5,train,2.0,-5.0,0.025,0.01,5.0\n");
    append(&m, "0,6,val,2.0,1.5,0.025,0.01,6.0\n");
    append(&m, "0,7,train,2.0,0.5,-0.025,0.01,7.0\n");
    append(&m, "0,8,train,2.0,0.5,NaN,0.01,8.0\n");
    std::fs::write(d.join("genotypes.csv"), "epoch,genotype\n0,\"Genotype(normal=[], x\"\n")
        .unwrap();
    let mut r = RunReader::open(&d).unwrap();
    r.poll().unwrap();
    let s = r.state();
    assert_eq!(s.train.iter().map(|t| t.step).collect::<Vec<_>>(), [1, 4]);
    assert!(s.val.is_empty());
    assert_eq!(s.skipped_rows, 7);
    // A genotype that does not parse is kept as text (the panel shows it raw).
    assert_eq!(s.genotypes.len(), 1);
}

#[test]
fn a_rewritten_file_rebuilds_the_state() {
    let d = scratch("rewrite");
    let m = d.join("metrics.csv");
    append(&m, METRICS);
    for step in 1..=4 {
        append(&m, &format!("0,{step},train,2.{step},0.1,0.025,0.01,{step}.0\n"));
    }
    append(
        &d.join("nan_events.csv"),
        "epoch,step,site,layer,value,action\n0,3,loss,loss,NaN,rolled_back\n",
    );
    let mut r = RunReader::open(&d).unwrap();
    r.poll().unwrap();
    assert_eq!(r.state().train.len(), 4);
    // A resume cuts the file back to step 2 (temp file + rename) and appends step 3 again.
    let tmp = d.join("metrics.tmp");
    std::fs::write(&tmp, format!("{METRICS}0,1,train,2.1,0.1,0.025,0.01,1.0\n0,2,train,2.2,0.1,0.025,0.01,2.0\n0,3,train,1.9,0.1,0.025,0.01,0.5\n0,4,train,1.8,0.1,0.025,0.01,1.0\n0,5,train,1.7,0.1,0.025,0.01,1.5\n")).unwrap();
    std::fs::rename(&tmp, &m).unwrap();
    assert!(r.poll().unwrap());
    let s = r.state();
    assert_eq!(s.train.iter().map(|t| t.loss).collect::<Vec<_>>(), [2.1, 2.2, 1.9, 1.8, 1.7]);
    // Rebuilt from every file, not only the rewritten one.
    assert_eq!(s.nan.len(), 1);
    // The time column restarted with the resumed process: the rate uses the new process only.
    assert_eq!(s.steps_per_sec(), Some(2.0));
}

#[test]
fn the_lock_of_a_live_process_reads_as_running() {
    let d = scratch("lock");
    std::fs::write(d.join("lock"), format!("{}\n", std::process::id())).unwrap();
    let mut r = RunReader::open(&d).unwrap();
    r.poll().unwrap();
    assert_eq!(r.state().status, RunStatus::Running(std::process::id()));
    std::fs::remove_file(d.join("lock")).unwrap();
    std::fs::write(d.join("plan.json"), r#"{"epochs": 2, "steps_per_epoch": 5}"#).unwrap();
    r.poll().unwrap();
    assert_eq!(r.state().status, RunStatus::Stopped);
    assert_eq!(r.state().total_steps(), Some(10));
    std::fs::write(d.join("genotype.txt"), "Genotype(...)\n").unwrap();
    r.poll().unwrap();
    assert_eq!(r.state().status, RunStatus::Finished);
}

#[test]
fn a_missing_or_foreign_folder_is_an_error_naming_it() {
    let d = std::env::temp_dir().join("qdarts-tui-no-such-run");
    let err = RunReader::open(&d).unwrap_err();
    assert!(matches!(err, DashboardError::NotARun { .. }));
    assert!(
        err.to_string().contains("qdarts-tui-no-such-run") && err.to_string().contains("no such")
    );
    let empty = qdarts_record::scratch::scratch("tui-empty");
    let err = RunReader::open(&empty).unwrap_err().to_string();
    assert!(err.contains("not a qdarts run folder"), "{err}");
}
