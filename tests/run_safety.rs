//! Run safety as a user meets it: bad data, bad hyperparameters and misused `--resume` are
//! clear errors (exit 1, no run folder left behind); `--extend-epochs` is the one allowed
//! change to a run and is recorded; simultaneous `--resume` of one run lets exactly one in; a
//! full disk or a refused allocation mid-run is an error from which `--resume` finishes the run.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{qdarts, tiny_search, write_config};

fn scratch(name: &str) -> PathBuf {
    common::scratch("safety", name)
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit 1 with every one of `needles` in the message.
fn refused(out: &Output, needles: &[&str]) {
    let err = text(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

/// The run folders under `dir/results`.
fn runs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir.join("results"))
        .map(|rd| rd.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

/// The search config of these tests.
fn search_config() -> String {
    tiny_search("safe", 3, 2)
}

const TRAIN: &str = r#"
name = "safe-train"
seed = 3
genotype = "DARTS_V2"
[data]
dataset = "fashion-mnist"
limit = 64
test_limit = 32
[model]
init_channels = 2
layers = 3
auxiliary = false
[train]
epochs = 1
batch_size = 8
steps_per_epoch = 2
[record]
checkpoint_every = 1
"#;

/// Writes an MNIST-style IDX pair (`prefix`-images/labels) of `n` random `h`×`w` images.
fn write_idx(dir: &Path, prefix: &str, n: usize, h: usize, w: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let mut x = 12345u32;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    let mut img = Vec::new();
    for v in [0x803u32, n as u32, h as u32, w as u32] {
        img.extend(v.to_be_bytes());
    }
    img.extend((0..n * h * w).map(|_| next() as u8));
    let mut lab = Vec::new();
    for v in [0x801u32, n as u32] {
        lab.extend(v.to_be_bytes());
    }
    lab.extend((0..n).map(|_| (next() % 10) as u8));
    std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte")), img).unwrap();
    std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte")), lab).unwrap();
}

#[test]
fn image_shapes_the_network_cannot_take_are_refused_before_a_run_folder() {
    let d = scratch("shapes");
    let (search, train) =
        (write_config(&d, "s.toml", &search_config()), write_config(&d, "t.toml", TRAIN));
    for side in [30, 27, 5, 3, 1] {
        let data = d.join(format!("side{side}"));
        write_idx(&data, "train", 80, side, side);
        write_idx(&data, "t10k", 40, side, side);
        for cfg in [&search, &train] {
            let sub = if cfg == &search { "search" } else { "train" };
            let out = qdarts()
                .args([sub, "--dataset", "mnist", "--config"])
                .arg(cfg)
                .arg("--data")
                .arg(&data)
                .output()
                .unwrap();
            refused(&out, &[&format!("images of {side}×{side}"), "multiples of 4"]);
            assert!(runs(&d).is_empty(), "{sub} on {side}×{side} left a run folder");
        }
    }
    // Training images 28×28 with test images 32×32.
    let mix = d.join("mix");
    write_idx(&mix, "train", 80, 28, 28);
    write_idx(&mix, "t10k", 40, 32, 32);
    let out = qdarts()
        .args(["train", "--dataset", "mnist", "--config"])
        .arg(&train)
        .arg("--data")
        .arg(&mix)
        .output()
        .unwrap();
    refused(&out, &["training images are 1×28×28 but test images are 1×32×32"]);
    // A limit beyond the set.
    let out =
        qdarts().args(["search", "--set", "data.limit=1000000", "--config"]).arg(&search).output();
    refused(&out.unwrap(), &["`data.limit` is 1000000, more than the 10000 images"]);
    assert!(runs(&d).is_empty());
}

#[test]
fn hyperparameters_that_make_nan_are_refused_naming_the_override() {
    let d = scratch("nan-hyper");
    let (search, train) =
        (write_config(&d, "s.toml", &search_config()), write_config(&d, "t.toml", TRAIN));
    let cases = [
        (&search, "search", "search.w_weight_decay=nan"),
        (&search, "search", "search.alpha_betas=[2.0,-1.0]"),
        (&search, "search", "search.w_momentum=-5"),
        (&search, "search", "nan_guard.max_events=0"),
        (&search, "search", "search.w_lr=inf"),
        (&train, "train", "train.momentum=nan"),
        (&train, "train", "train.weight_decay=-1"),
    ];
    for (cfg, sub, set) in cases {
        let out = qdarts().args([sub, "--set", set, "--config"]).arg(cfg).output().unwrap();
        let key = set.split_once('=').unwrap().0;
        refused(&out, &[&format!("--set {set}"), key]);
    }
    assert!(runs(&d).is_empty());
}

#[test]
fn a_training_run_with_a_nan_test_loss_logs_it_and_exits_nonzero_when_it_aborts() {
    let d = scratch("nan-test");
    let cfg = write_config(&d, "t.toml", TRAIN);
    // The NaN is injected by the library (no flag or key reaches it), the guard skips it.
    let cfg =
        <qdarts_train::TrainConfig as qdarts_engine::config::Experiment>::load(&cfg, &[]).unwrap();
    let genotype = qdarts_train::resolve_genotype(&cfg.genotype).unwrap();
    let device = burn::tensor::Device::flex();
    let at = qdarts_engine::NanInjection { step: 2, site: qdarts_engine::InjectSite::Val };
    let prepared = qdarts_train::prepare_train(&cfg, &genotype, &device).unwrap().inject_nan(at);
    let run = qdarts_record::RunDir::create(&cfg.record.results_dir, &cfg.name).unwrap();
    let go = &mut |_: &qdarts_engine::Progress| std::ops::ControlFlow::Continue(());
    assert!(qdarts_train::run_train_prepared(prepared, &run, false, go).unwrap());
    drop(run);
    let run = runs(&d).pop().unwrap();
    let events = std::fs::read_to_string(run.join("nan_events.csv")).unwrap();
    assert_eq!(events.lines().nth(1), Some("0,2,eval,val,NaN,skipped"), "{events}");
    // An overflowing learning rate: every step after the first is non-finite.
    let d = scratch("nan-abort");
    let cfg = write_config(&d, "t.toml", TRAIN);
    let out = qdarts()
        .args(["train", "--set", "train.lr=1e38", "--set", "train.epochs=4"])
        .args(["--set", "nan_guard.max_events=2", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    refused(&out, &["aborted after 3 steps with non-finite values"]);
}

/// A finished search run in `d/results`.
fn finished_search(d: &Path) -> PathBuf {
    let cfg = write_config(d, "s.toml", &search_config());
    let out = qdarts().args(["search", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    runs(d).pop().unwrap()
}

#[test]
fn resume_keeps_the_run_config_and_only_extend_epochs_changes_it() {
    let d = scratch("resume");
    let run = finished_search(&d);
    let config_before = std::fs::read_to_string(run.join("config.toml")).unwrap();
    // Anything that would change the run is refused by the command line.
    for extra in [
        &["--set", "search.batch_size=4"][..],
        &["--set", "search.epochs=5"],
        &["--config", "experiments/default.toml"],
        &["--data", "/tmp"],
        &["--dataset", "mnist"],
    ] {
        let out = qdarts().args(["search", "--resume"]).arg(&run).args(extra).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out));
        assert!(text(&out).contains("cannot be used with"), "{}", text(&out));
    }
    let out = qdarts().args(["search", "--extend-epochs", "2"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "--extend-epochs needs --resume");
    assert_eq!(std::fs::read_to_string(run.join("config.toml")).unwrap(), config_before);

    // The allowed change: two more epochs, recorded.
    let out =
        qdarts().args(["search", "--extend-epochs", "2", "--resume"]).arg(&run).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let changes = std::fs::read_to_string(run.join("changes.csv")).unwrap();
    let rows: Vec<&str> = changes.lines().collect();
    assert_eq!(rows[0], "utc,step,key,from,to");
    assert_eq!(rows.len(), 2, "{changes}");
    assert!(rows[1].ends_with(",4,search.epochs,2,4"), "{changes}");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("epochs = 4"), "{config}");
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let vals: Vec<&str> = metrics.lines().filter(|l| l.contains(",val,")).collect();
    assert_eq!(vals.len(), 4, "{metrics}");
    assert!(vals[3].starts_with("3,8,val,"), "{metrics}");

    // A search run is not a training run, and the reverse.
    let out = qdarts().args(["train", "--resume"]).arg(&run).output().unwrap();
    refused(&out, &["is a search run, not a training run"]);
    for sub in ["freeze", "eval"] {
        let out = qdarts().arg(sub).arg(&run).output().unwrap();
        refused(&out, &["is a search run, not a training run"]);
    }
    // One damaged file in the last checkpoint: the resume goes back to the one before (a
    // checkpoint every step here: step 7 of 8), says so, and finishes with the same record.
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let cut = run.join("checkpoint").join("a_optim.bpk");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
    let out = qdarts().arg("check").arg(&run).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("PROBLEM  checkpoint/"), "{report}");
    assert!(report.contains("does not verify: a_optim.bpk has"), "{report}");
    assert!(report.contains("would continue from checkpoint.prev/ at step 7"), "{report}");
    assert!(report.contains("1 training row after step 7 (a resume redoes it)"), "{report}");
    let out = qdarts().args(["search", "--resume"]).arg(&run).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let note = text(&out);
    assert!(note.contains("note: checkpoint/ does not verify (a_optim.bpk has"), "{note}");
    assert!(note.contains("resuming from checkpoint.prev/ at step 7, 1 step earlier"), "{note}");
    let wall = |m: &str| -> Vec<String> {
        m.lines().map(|l| l.rsplit_once(',').map_or(l, |(a, _)| a).to_string()).collect()
    };
    let again = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert_eq!(wall(&again), wall(&metrics));
    let out = qdarts().arg("check").arg(&run).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}{}", text(&out));
    assert!(report.contains("no problems found"), "{report}");

    // Both checkpoints damaged: exit 1, each named, the record untouched.
    for dir in ["checkpoint", "checkpoint.prev"] {
        std::fs::write(run.join(dir).join("state.json"), "{").unwrap();
    }
    let out = qdarts().args(["search", "--resume"]).arg(&run).output().unwrap();
    refused(&out, &["no checkpoint to resume from", "checkpoint/ does not verify (state.json"]);
    assert_eq!(std::fs::read_to_string(run.join("metrics.csv")).unwrap(), again);

    // A run without any checkpoint starts over, and says so.
    std::fs::remove_dir_all(run.join("checkpoint")).unwrap();
    std::fs::remove_dir_all(run.join("checkpoint.prev")).unwrap();
    let out = qdarts().args(["search", "--resume"]).arg(&run).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("has no checkpoint yet: the run starts over from step 0"));
}

#[test]
fn device_flags_on_cpu_only_commands_are_refused() {
    for args in [
        &["--backend", "wgpu", "export", "/nonexistent"][..],
        &["--backend", "wgpu", "bench", "runtime", "/nonexistent"],
    ] {
        let out = qdarts().args(args).output().unwrap();
        // Without the wgpu feature the backend itself is refused; with it, the command is.
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        let err = text(&out);
        assert!(err.contains("runs on the CPU") || err.contains("wgpu"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// Starts `n` `qdarts search --resume run` at once; waits until all but one have exited and
/// checks that each of those was refused by the lock; kills the one left (the holder).
fn race(run: &Path, n: usize) {
    let mut children: Vec<Child> = (0..n)
        .map(|_| {
            qdarts()
                .args(["search", "--resume"])
                .arg(run)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut exited = Vec::new();
    while exited.len() < n - 1 {
        assert!(Instant::now() < deadline, "{} of {n} still running", n - exited.len());
        let mut i = 0;
        while i < children.len() {
            if children[i].try_wait().unwrap().is_some() {
                exited.push(children.remove(i).wait_with_output().unwrap());
            } else {
                i += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for out in &exited {
        refused(out, &["is held by", "which is still running"]);
    }
    assert_eq!(children.len(), 1);
    let mut holder = children.pop().unwrap();
    assert!(holder.try_wait().unwrap().is_none(), "the holder must still be running");
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn simultaneous_resumes_of_one_run_let_exactly_one_in() {
    let d = scratch("race");
    // A search long enough that the holder is still running when the others try.
    let long = tiny_search("safe", 3, 100000);
    let cfg = write_config(&d, "long.toml", &long);
    let mut first = qdarts()
        .args(["search", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    let run = loop {
        if let Some(run) = runs(&d).pop()
            && run.join("checkpoint").join("state.json").exists()
        {
            break run;
        }
        assert!(Instant::now() < deadline, "no checkpoint appeared");
        std::thread::sleep(Duration::from_millis(20));
    };
    first.kill().unwrap();
    first.wait().unwrap();
    for _ in 0..20 {
        race(&run, 2);
    }
    for _ in 0..20 {
        race(&run, 5);
    }
    // The run is still whole: it resumes and its record has no torn rows.
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert!(metrics.lines().all(|l| l.split(',').count() == 8), "{metrics}");
}

/// A network too big for the machine is refused before it allocates: exit 1, the estimate,
/// what is free and the keys to lower, no run folder. Under an address-space limit (`ulimit
/// -v`, 6 GiB) as well as without one; for the search's channels, cells and nodes and the
/// training's channels.
#[test]
fn a_network_too_big_for_the_machine_is_refused_before_it_allocates() {
    let d = scratch("too-big");
    let cfg = write_config(&d, "s.toml", &search_config());
    let cases: [(&str, &[&str]); 3] = [
        ("search", &["--set", "model.init_channels=4096"]),
        ("search", &["--set", "model.layers=64", "--set", "model.init_channels=256"]),
        ("search", &["--set", "model.nodes=16", "--set", "model.init_channels=512"]),
    ];
    for (sub, sets) in cases {
        let out = qdarts().args([sub, "--config"]).arg(&cfg).args(sets).output().unwrap();
        refused(&out, &["the supernet needs about", "GiB", "is free (", "lower search.batch_size"]);
        assert!(runs(&d).is_empty(), "{sets:?} left a run folder");
    }
    // The reproduction: 6 GiB of address space, C = 4096 on 64 images, one epoch.
    let bin = env!("CARGO_BIN_EXE_qdarts");
    let script = format!(
        "ulimit -v 6291456 && exec '{bin}' search --config '{}' --set model.init_channels=4096 \
         --set data.limit=64 --set search.epochs=1",
        cfg.display()
    );
    let out = std::process::Command::new("sh").args(["-c", &script]).output().unwrap();
    refused(&out, &["the supernet needs about", "under the address-space limit, ulimit -v"]);
    assert!(runs(&d).is_empty());

    let train = write_config(&d, "t.toml", TRAIN);
    let out = qdarts()
        .args(["train", "--config"])
        .arg(&train)
        .args(["--set", "model.init_channels=4096"])
        .output()
        .unwrap();
    refused(&out, &["the network needs about", "lower train.batch_size"]);
    assert!(runs(&d).is_empty());
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount's syntax, e.g. `2900k`) at `dir`; `None` where this
    /// process may not mount (not root, no CAP_SYS_ADMIN), and the test skips.
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The disk fills in the middle of a search (a 2.9 MB tmpfs as the results folder; the run
/// needs three checkpoints of ~0.9 MB and its tables): the run stops with exit 1 and an error
/// naming the file it could not write, a checkpoint that verifies stays, and once space is
/// freed `--resume` ends with the record of an uninterrupted run. Skipped where the test may
/// not mount a tmpfs.
#[test]
fn a_full_disk_stops_the_run_cleanly_and_a_resume_finishes_it() {
    let d = scratch("disk-full");
    let config = tiny_search("full", 3, 4);
    let (whole_dir, full) = (d.join("whole"), d.join("full"));
    std::fs::create_dir_all(&whole_dir).unwrap();
    let whole_cfg = write_config(&whole_dir, "s.toml", &config);
    let out = qdarts().args(["search", "--config"]).arg(&whole_cfg).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let whole = runs(&whole_dir).pop().unwrap();

    let Some(disk) = Tmpfs::mount(&full.join("results"), "2900k") else {
        qdarts_record::scratch::tool_missing("a tmpfs cannot be mounted here");
        return;
    };
    let cfg = write_config(&full, "s.toml", &config);
    let out = qdarts().args(["search", "--config"]).arg(&cfg).output().unwrap();
    let err = text(&out);
    refused(&out, &["No space left on device"]);
    let run = runs(&full).pop().unwrap();
    assert!(err.contains(&run.display().to_string()), "the error names no file of the run: {err}");
    let choice = qdarts_record::choose_checkpoint(&qdarts_record::RunLayout::new(&run));
    assert!(choice.dir.is_some(), "no checkpoint verifies after the disk filled: {choice:?}");

    disk.resize("16m");
    let out = qdarts().args(["search", "--resume"]).arg(&run).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    same_record(&run, &whole);
}

/// The run record of `run` is that of `whole` (minus `metrics.csv`'s wall-clock column).
fn same_record(run: &Path, whole: &Path) {
    let strip = |p: &Path| -> Vec<String> {
        let t = std::fs::read_to_string(p).unwrap();
        t.lines().map(|l| l.rsplit_once(',').map_or(l, |(a, _)| a).to_string()).collect()
    };
    assert_eq!(strip(&run.join("metrics.csv")), strip(&whole.join("metrics.csv")));
    for f in ["quant_error.csv", "alphas.csv", "genotypes.csv", "genotype.txt"] {
        let a = std::fs::read_to_string(run.join(f)).unwrap();
        let b = std::fs::read_to_string(whole.join(f)).unwrap();
        assert!(a == b, "{f} differs from the uninterrupted run's");
    }
}

/// An allocation refused in the middle of a run (the operating system's refusal, injected
/// after epoch 2's first step by `QDARTS_INJECT_ALLOC_FAILURE`, as an address-space or cgroup
/// limit would refuse it) ends the process with exit 1 and one line giving the size and the
/// step, not Rust's abort; the last checkpoint verifies, and `--resume` finishes with the record
/// of an uninterrupted run. A malformed injection value is an error naming the variable.
#[test]
fn a_failed_allocation_mid_run_names_the_step_and_a_resume_finishes_the_run() {
    let d = scratch("oom");
    let config = tiny_search("oom", 3, 2);
    let (whole_dir, failed) = (d.join("whole"), d.join("failed"));
    std::fs::create_dir_all(&whole_dir).unwrap();
    std::fs::create_dir_all(&failed).unwrap();
    let whole_cfg = write_config(&whole_dir, "s.toml", &config);
    let out = qdarts().args(["search", "--config"]).arg(&whole_cfg).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let whole = runs(&whole_dir).pop().unwrap();

    let cfg = write_config(&failed, "s.toml", &config);
    let out = qdarts()
        .env("QDARTS_INJECT_ALLOC_FAILURE", "1:1")
        .args(["search", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = text(&out);
    refused(&out, &["out of memory: an allocation of", "in epoch 2 after step 1 of 2", "--resume"]);
    assert!(!err.contains("memory allocation of"), "Rust's abort message: {err}");
    let run = runs(&failed).pop().unwrap();
    let choice = qdarts_record::choose_checkpoint(&qdarts_record::RunLayout::new(&run));
    assert!(choice.dir.is_some(), "no checkpoint verifies after the failure: {choice:?}");
    let out = qdarts().args(["search", "--resume"]).arg(&run).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    same_record(&run, &whole);

    let out = qdarts()
        .env("QDARTS_INJECT_ALLOC_FAILURE", "1")
        .args(["search", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    refused(&out, &["QDARTS_INJECT_ALLOC_FAILURE=1: expected EPOCH:STEP"]);
}
