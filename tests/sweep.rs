//! `qdarts sweep`, `search|train --sweep`, `compare`, `sample` and `plot` as a user runs
//! them: a sweep of 2 configs × 2 seeds run locally two at a time gives the same run records
//! as its trials run one by one the way a Slurm array task runs them (trial number from
//! `SLURM_ARRAY_TASK_ID`, or Kubernetes' `JOB_COMPLETION_INDEX`); `compare` reads the
//! numbers the runs wrote; random genotypes train as a baseline sweep; bad input is refused
//! before anything is written.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{qdarts, scratch, tiny_search};

fn run_ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A sweep of the tiny search: 2 quantization presets × 2 seeds, results in `results`.
fn write_sweep(d: &Path, name: &str, results: &str) -> PathBuf {
    std::fs::write(d.join("base.toml"), tiny_search("base", 0, 2)).expect("base");
    let text = format!(
        "name = \"{name}\"\nconfig = \"{}\"\nresults_dir = \"{}\"\nseeds = [1, 2]\n[grid]\n\"quant.preset\" = [\"float\", \"tensorrt\"]\n",
        d.join("base.toml").display(),
        d.join(results).display()
    );
    let p = d.join(format!("{name}-{results}.toml"));
    std::fs::write(&p, text).expect("sweep file");
    p
}

/// The files of a run record that must not depend on how it was run (`metrics.csv` without
/// its wall-clock column).
fn record(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for f in [
        "metrics.csv",
        "alphas.csv",
        "genotypes.csv",
        "quant_error.csv",
        "genotype.json",
        "plan.json",
    ] {
        let text = std::fs::read_to_string(dir.join(f))
            .unwrap_or_else(|_| panic!("{}/{f}", dir.display()));
        let text = if f == "metrics.csv" {
            text.lines()
                .map(|l| l.rsplit_once(',').map_or(l, |(a, _)| a))
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            text
        };
        out.push((f.to_string(), text));
    }
    out
}

#[test]
fn a_sweep_runs_locally_like_scheduler_tasks_and_compares() {
    let d = scratch("sweep", "local");
    let spec = write_sweep(&d, "grid", "local");
    let out = run_ok(
        qdarts()
            .arg("sweep")
            .arg(&spec)
            .args(["--emit", "slurm", "--emit", "k8s", "--local", "--jobs", "2"])
            .current_dir(&d)
            .output()
            .expect("runs"),
    );
    assert!(out.contains("sweep `grid`: 4 search trials"), "{out}");
    let root = d.join("local").join("grid");
    for f in ["trials.json", "base.toml", "sweep.toml", "sweep.sbatch", "job.yaml"] {
        assert!(root.join(f).exists(), "{f}");
    }
    let sbatch = std::fs::read_to_string(root.join("sweep.sbatch")).expect("sbatch");
    assert!(sbatch.contains("#SBATCH --array=0-3\n"), "{sbatch}");
    // Every trial finished, with a log; the sweep says so.
    let status = run_ok(qdarts().arg("sweep").arg(&root).output().expect("status"));
    assert_eq!(status.matches(" finished").count(), 4, "{status}");
    for n in 0..4 {
        assert!(root.join(format!("logs/trial-00{n}.log")).exists());
        let cfg =
            std::fs::read_to_string(root.join(format!("trial-00{n}/config.toml"))).expect("cfg");
        assert!(cfg.contains(&format!("name = \"grid-trial-00{n}\"")), "{cfg}");
        let seed = if n % 2 == 0 { 1 } else { 2 };
        assert!(cfg.contains(&format!("seed = {seed}")), "{cfg}");
        let preset = if n < 2 { "float" } else { "tensorrt" };
        assert!(cfg.contains(&format!("preset = \"{preset}\"")), "{cfg}");
    }

    // The same sweep elsewhere, each trial run as an array task runs it: one at a time, the
    // trial number from the scheduler's environment, two threads.
    let spec2 = write_sweep(&d, "grid", "tasks");
    run_ok(qdarts().arg("sweep").arg(&spec2).output().expect("made"));
    let root2 = d.join("tasks").join("grid");
    for n in 0..4 {
        let var = if n % 2 == 0 { "SLURM_ARRAY_TASK_ID" } else { "JOB_COMPLETION_INDEX" };
        let out = run_ok(
            qdarts()
                .args(["search", "--sweep"])
                .arg(&root2)
                .env(var, n.to_string())
                .env("RAYON_NUM_THREADS", "2")
                .output()
                .expect("task"),
        );
        assert!(out.trim_end().ends_with(&format!("trial-00{n}")), "{out}");
        assert_eq!(
            record(&root.join(format!("trial-00{n}"))),
            record(&root2.join(format!("trial-00{n}"))),
            "trial {n}: local and task records differ"
        );
    }
    // A task started again after its trial finished does nothing.
    let again = qdarts()
        .args(["search", "--sweep"])
        .arg(&root2)
        .env("SLURM_ARRAY_TASK_ID", "1")
        .output()
        .expect("again");
    run_ok(again.clone());
    assert!(stderr(&again).contains("has finished already"), "{}", stderr(&again));

    // compare: the table, the groups and the CSV hold what the runs wrote.
    let csv_path = d.join("cmp.csv");
    let plots = d.join("cmp-plots");
    let table = run_ok(
        qdarts()
            .arg("compare")
            .arg(&root)
            .arg("--csv")
            .arg(&csv_path)
            .arg("--plot")
            .arg(&plots)
            .output()
            .expect("compare"),
    );
    assert!(table.contains("configs differ in: quant.preset, seed"), "{table}");
    assert!(table.contains("G1  quant.preset=float: top-1"), "{table}");
    assert!(table.contains("G2  quant.preset=tensorrt: top-1"), "{table}");
    assert!(table.contains("genotype stability, G1"), "{table}");
    let csv = std::fs::read_to_string(&csv_path).expect("csv");
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().expect("header").split(',').collect();
    let top1_col = head.iter().position(|h| *h == "top1").expect("top1 column");
    let mut top1s = Vec::new();
    for (n, line) in lines.enumerate() {
        let cols: Vec<&str> = line.split(',').collect();
        let metrics =
            std::fs::read_to_string(root.join(format!("trial-00{n}/metrics.csv"))).expect("m");
        let last_val = metrics.lines().rfind(|l| l.contains(",val,")).expect("val row");
        let want: f64 = last_val.split(',').nth(4).expect("top1").parse().expect("number");
        let got: f64 = cols[top1_col].parse().expect("number");
        assert!((got - want).abs() < 1e-6, "trial {n}: {got} vs {want}");
        top1s.push(got);
    }
    assert_eq!(top1s.len(), 4);
    // Group G1 (float, seeds 1 and 2): mean ± sample std of the two.
    let (a, b) = (top1s[0], top1s[1]);
    let mean = (a + b) / 2.0;
    let std = ((a - mean).powi(2) + (b - mean).powi(2)).sqrt();
    let want =
        format!("G1  quant.preset=float: top-1 {:.2} ± {:.2} % (n=2)", 100.0 * mean, 100.0 * std);
    assert!(table.contains(&want), "{want}\n{table}");
    for f in ["compare-top1.png", "compare-top1.svg", "compare-curves.png", "compare-curves.svg"] {
        assert!(plots.join(f).exists(), "{f}");
    }

    // plot of one trial.
    let files = run_ok(
        qdarts()
            .arg("plot")
            .arg(root.join("trial-002"))
            .args(["--cells", "builtin"])
            .output()
            .expect("plot"),
    );
    for f in ["normal.png", "reduce.svg", "curves.png", "alphas-normal.svg", "quant-error.png"] {
        assert!(files.contains(f), "{f} missing:\n{files}");
    }
}

#[test]
fn random_genotypes_train_as_a_baseline_sweep_and_compare_against_a_searched_one() {
    let d = scratch("sweep", "baseline");
    let out = run_ok(
        qdarts()
            .args(["sample", "--random", "2", "--seed", "5", "--out"])
            .arg(d.join("random"))
            .arg("--config")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/default.toml"))
            .output()
            .expect("sample"),
    );
    assert_eq!(out.lines().count(), 2, "{out}");
    for i in 0..2 {
        let text =
            std::fs::read_to_string(d.join(format!("random/random-00{i}.txt"))).expect("txt");
        assert!(text.starts_with("Genotype(normal=[["), "{text}");
        assert!(!text.contains("'none'"), "{text}");
    }
    // The same seed draws the same genotypes; an existing file is not overwritten.
    let again = qdarts()
        .args(["sample", "--random", "2", "--seed", "5", "--out"])
        .arg(d.join("random"))
        .arg("--config")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/default.toml"))
        .output()
        .expect("sample");
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("random-000.json exists"), "{}", stderr(&again));

    let base = "name = \"t\"\nseed = 0\ngenotype = \"DARTS_V2\"\n[data]\ndataset = \"fashion-mnist\"\nlimit = 64\ntest_limit = 64\n[model]\ninit_channels = 2\nlayers = 3\n[train]\nepochs = 1\nbatch_size = 16\n[record]\nquant_error_every = 4\ncheckpoint_every = 4\n";
    std::fs::write(d.join("train.toml"), base).expect("base");
    let sweep = format!(
        "name = \"b\"\nkind = \"train\"\nconfig = \"{cfg}\"\nresults_dir = \"{res}\"\nseeds = [1, 2]\n\
         [[variant]]\nlabel = \"searched\"\nset = {{ genotype = \"DARTS_V2\" }}\n\
         [[variant]]\nlabel = \"random-0\"\nset = {{ genotype = \"{r0}\" }}\n\
         [[variant]]\nlabel = \"random-1\"\nset = {{ genotype = \"{r1}\" }}\n",
        cfg = d.join("train.toml").display(),
        res = d.join("results").display(),
        r0 = d.join("random/random-000.json").display(),
        r1 = d.join("random/random-001.json").display(),
    );
    std::fs::write(d.join("b.toml"), sweep).expect("sweep");
    run_ok(
        qdarts()
            .arg("sweep")
            .arg(d.join("b.toml"))
            .args(["--local", "--jobs", "2"])
            .output()
            .expect("sweep"),
    );
    let root = d.join("results").join("b");
    // A search sweep's runner refuses a training sweep.
    let wrong = qdarts()
        .args(["search", "--sweep"])
        .arg(&root)
        .args(["--trial", "0"])
        .output()
        .expect("wrong");
    assert_eq!(wrong.status.code(), Some(1));
    assert!(stderr(&wrong).contains("qdarts train --sweep"), "{}", stderr(&wrong));
    // Each trial trained the genotype it was given.
    let g1 = std::fs::read_to_string(root.join("trial-003/genotype.json")).expect("g");
    let r0 = std::fs::read_to_string(d.join("random/random-000.json")).expect("r0");
    assert_eq!(g1, r0);
    let searched: Vec<PathBuf> = (0..2).map(|n| root.join(format!("trial-00{n}"))).collect();
    let random: Vec<PathBuf> = (2..6).map(|n| root.join(format!("trial-00{n}"))).collect();
    let table = run_ok(
        qdarts()
            .arg("compare")
            .args(&searched)
            .arg("--baseline")
            .args(&random)
            .output()
            .expect("compare"),
    );
    // DARTS_V2 is no search run folder: one method, said so.
    assert!(table.contains("methods against the baseline (6 finished training runs"), "{table}");
    assert!(table.contains("is not a search run folder here"), "{table}");
    assert!(table.contains("baseline  2 genotypes, 4 runs"), "{table}");
    assert!(table.contains("Mann–Whitney U = "), "{table}");
    assert!(!table.contains("beats"), "{table}");
    assert!(table.contains("configs differ in: genotype, seed"), "{table}");
    // A baseline run trained with another learning rate: refused, the key and its values
    // named; allowed on purpose with a warning.
    let odd = d.join("odd");
    copy_dir(&random[3], &odd);
    let cfg = std::fs::read_to_string(odd.join("config.toml")).expect("config");
    let lr = cfg.lines().find(|l| l.starts_with("lr = ")).expect("an lr line").to_string();
    std::fs::write(odd.join("config.toml"), cfg.replace(&lr, "lr = 0.5")).expect("config");
    let mut mixed = random[..3].to_vec();
    mixed.push(odd.clone());
    let cmp = |extra: &[&str]| {
        qdarts()
            .arg("compare")
            .args(&searched)
            .arg("--baseline")
            .args(&mixed)
            .args(extra)
            .output()
            .expect("compare")
    };
    let refused = cmp(&[]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    let err = stderr(&refused);
    assert!(
        err.contains("train.lr (0.025 / 0.5)") && err.contains("--allow-differing-keys"),
        "{err}"
    );
    let allowed = cmp(&["--allow-differing-keys"]);
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));
    assert!(stderr(&allowed).contains("warning: "), "{}", stderr(&allowed));
    // An unfinished run (its plan says two epochs) is listed and left out of the statistics.
    let plan = std::fs::read_to_string(odd.join("plan.json")).expect("plan");
    let planned = plan.replace("\"epochs\":1", "\"epochs\":2");
    assert_ne!(plan, planned, "{plan}");
    std::fs::write(odd.join("plan.json"), planned).expect("plan");
    let out = cmp(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        table.contains("unfinished, left out of every statistic:\n  odd: 1 of 2 epochs"),
        "{table}"
    );
    assert!(table.contains("(5 finished training runs"), "{table}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir").filter_map(Result::ok) {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

#[test]
fn bad_sweeps_and_trials_are_refused_before_anything_is_written() {
    let d = scratch("sweep", "bad");
    std::fs::write(d.join("base.toml"), tiny_search("base", 0, 1)).expect("base");
    let write = |name: &str, grid: &str| {
        let p = d.join(format!("{name}.toml"));
        std::fs::write(
            &p,
            format!(
                "name = \"{name}\"\nconfig = \"{}\"\nresults_dir = \"{}\"\n[grid]\n{grid}\n",
                d.join("base.toml").display(),
                d.join("results").display()
            ),
        )
        .expect("write");
        p
    };
    // A value the search refuses: exit 1 naming the trial and the key, no sweep folder.
    let p = write("zero", "\"search.epochs\" = [1, 0]");
    let out = qdarts().arg("sweep").arg(&p).output().expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("trial 1 (epochs=0)") && err.contains("search.epochs"), "{err}");
    assert!(!d.join("results").join("zero").exists());
    // An unknown key.
    let p = write("typo", "\"search.epoch\" = [1]");
    let out = qdarts().arg("sweep").arg(&p).output().expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("epoch"), "{}", stderr(&out));
    assert!(!d.join("results").join("typo").exists());
    // A missing sweep file or base config.
    let out = qdarts().args(["sweep", "/no/such/sweep.toml"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("/no/such/sweep.toml"), "{}", stderr(&out));

    let p = write("ok", "\"search.epochs\" = [1]");
    run_ok(qdarts().arg("sweep").arg(&p).output().expect("made"));
    let root = d.join("results").join("ok");
    let trial = |args: &[&str], env: Option<(&str, &str)>| {
        let mut c = qdarts();
        c.args(["search", "--sweep"])
            .arg(&root)
            .args(args)
            .env_remove("SLURM_ARRAY_TASK_ID")
            .env_remove("JOB_COMPLETION_INDEX");
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        c.output().expect("runs")
    };
    for (args, env, code, needle) in [
        (&["--trial", "3"][..], None, 1, "no trial 3"),
        (&[][..], None, 1, "--trial N"),
        (&[][..], Some(("SLURM_ARRAY_TASK_ID", "x1")), 1, "SLURM_ARRAY_TASK_ID"),
        (&["--config", "x.toml"][..], None, 2, "cannot be used with"),
        (&["--set", "seed=3"][..], None, 2, "cannot be used with"),
    ] {
        let out = trial(args, env);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
        assert!(!root.join("trial-000").exists() && !root.join("trial-003").exists());
    }
    // --trial without --sweep; a folder that is not a sweep.
    let out = qdarts().args(["search", "--trial", "1"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let out = qdarts().args(["search", "--sweep"]).arg(&d).output().expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not a sweep folder"), "{}", stderr(&out));
    // compare and plot on folders without runs.
    let out = qdarts().arg("compare").arg(d.join("base.toml")).output().expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let out = qdarts().arg("plot").arg(&d).output().expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not a run folder"), "{}", stderr(&out));
    // An equivalence margin needs pairs, and is a number of points.
    for (args, says) in [
        (&["--equivalence-margin", "0.5"][..], "--paired"),
        (&["--paired", "--equivalence-margin", "0"][..], "not a margin in points"),
        (&["--score", "int8"][..], "fake-quant, integer"),
    ] {
        let out = qdarts().arg("compare").arg(&d).args(args).output().expect("runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}

/// A `sweep --local` killed (SIGKILL) and started again: the trials of the killed sweep stop
/// at their next step, the new sweep waits for their folders instead of failing on them, and
/// every trial ends once, with the record of the same sweep run without a kill.
#[test]
fn a_killed_local_sweep_started_again_runs_every_trial_once() {
    let d = scratch("sweep", "killed");
    let sweep = write_sweep(&d, "k", "results");
    let calm = write_sweep(&d, "k", "calm");
    run_ok(qdarts().args(["sweep"]).arg(&calm).args(["--local", "--jobs", "2"]).output().unwrap());

    let mut first = qdarts()
        .args(["sweep"])
        .arg(&sweep)
        .args(["--local", "--jobs", "2"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once its first trials have written a checkpoint (or have finished).
    let trial0 = d.join("results").join("k").join("trial-000");
    let start = std::time::Instant::now();
    while !trial0.join("checkpoint").exists() && start.elapsed().as_secs() < 120 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let out = qdarts().args(["sweep"]).arg(&sweep).args(["--local", "--jobs", "2"]).output();
    let out = out.unwrap();
    run_ok(out.clone());
    assert!(stderr(&out).contains("all 4 trials finished"), "{}", stderr(&out));
    for n in 0..4 {
        let name = format!("trial-{n:03}");
        let a = record(&d.join("results").join("k").join(&name));
        let b = record(&d.join("calm").join("k").join(&name));
        for ((f, x), (_, y)) in a.iter().zip(&b) {
            assert!(x == y, "{name}/{f} differs from the sweep run without a kill");
        }
    }
}
