//! Sweep files, sweep folders, trial numbers from the schedulers' environments, the Slurm and
//! Kubernetes files, and the statistics of `compare`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use qdarts_genotypes::{Edge, Genotype, Primitive};
use qdarts_sweep::compare::{
    Comparison, Options, RunSummary, Score, Stability, Stats, baseline_summary, csv, report,
};
use qdarts_sweep::emit::{
    K8sOptions, SlurmOptions, TaskCommand, k8s_manifest, k8s_name, slurm_script,
};
use qdarts_sweep::{SweepDir, SweepSpec, TrialKind, trial_index};

fn scratch(name: &str) -> PathBuf {
    qdarts_record::scratch::scratch(&format!("sweep-{name}"))
}

fn parse(text: &str) -> Result<SweepSpec, String> {
    SweepSpec::parse(text, Path::new("s.toml")).map_err(|e| e.to_string())
}

const GRID: &str = r#"
name = "g"
config = "base.toml"
seeds = [7, 8]
[grid]
"search.alpha_lr" = [0.01, 0.003]
"quant.preset" = ["float", "tensorrt", "lsq"]
"#;

#[test]
fn a_grid_expands_with_the_last_key_and_the_seed_fastest() {
    let s = parse(GRID).expect("valid");
    assert_eq!(s.kind, TrialKind::Search);
    assert_eq!(s.results_dir, PathBuf::from("results"));
    assert_eq!(s.trials.len(), 2 * 3 * 2);
    // Keys in name order: quant.preset, then search.alpha_lr (fastest), then the seed.
    let t = &s.trials;
    assert_eq!(t[0].set, ["quant.preset=\"float\"", "search.alpha_lr=0.01", "seed=7"]);
    assert_eq!(t[1].set, ["quant.preset=\"float\"", "search.alpha_lr=0.01", "seed=8"]);
    assert_eq!(t[2].set, ["quant.preset=\"float\"", "search.alpha_lr=0.003", "seed=7"]);
    assert_eq!(t[11].set, ["quant.preset=\"lsq\"", "search.alpha_lr=0.003", "seed=8"]);
    assert_eq!(t[5].label, "preset=tensorrt alpha_lr=0.01 seed=8");
    for (i, trial) in t.iter().enumerate() {
        assert_eq!(trial.trial, i);
    }
    // Every combination exactly once.
    let mut sets: Vec<_> = t.iter().map(|x| x.set.clone()).collect();
    sets.sort();
    sets.dedup();
    assert_eq!(sets.len(), 12);
}

#[test]
fn variants_cross_the_grid_and_without_seeds_a_trial_keeps_the_config_seed() {
    let s = parse(
        r#"
name = "v"
kind = "train"
config = "t.toml"
results_dir = "elsewhere"
[grid]
"train.epochs" = [1, 2]
[[variant]]
label = "searched"
set = { genotype = "results/run/genotype.json" }
[[variant]]
label = "random"
set = { genotype = "results/random/random-000.json", "train.batch_size" = 16 }
"#,
    )
    .expect("valid");
    assert_eq!(s.kind, TrialKind::Train);
    assert_eq!(s.results_dir, PathBuf::from("elsewhere"));
    assert_eq!(s.trials.len(), 4);
    assert_eq!(s.trials[0].label, "searched epochs=1");
    assert_eq!(s.trials[0].seed, None);
    assert_eq!(
        s.trials[3].set,
        ["genotype=\"results/random/random-000.json\"", "train.batch_size=16", "train.epochs=2"]
    );
    // No grid, no variants, no seeds: one trial of the base config.
    let one = parse("name = \"one\"\nconfig = \"c.toml\"\n").expect("valid");
    assert_eq!(one.trials.len(), 1);
    assert_eq!(one.trials[0].label, "base");
    assert!(one.trials[0].set.is_empty());
}

#[test]
fn bad_sweep_files_are_refused_naming_the_file_and_the_key() {
    let cases = [
        ("name = \"a b\"\nconfig = \"c\"\n", "`name`"),
        ("name = \"-x\"\nconfig = \"c\"\n", "`name`"),
        ("name = \"x\"\n", "config"),
        ("name = \"x\"\nconfig = \"c\"\nbogus = 1\n", "bogus"),
        ("name = \"x\"\nconfig = \"c\"\n[grid]\nseed = [1, 2]\n", "`seed`"),
        ("name = \"x\"\nconfig = \"c\"\n[grid]\nname = [\"a\"]\n", "`name`"),
        (
            "name = \"x\"\nconfig = \"c\"\n[grid]\n\"record.results_dir\" = [\"a\"]\n",
            "record.results_dir",
        ),
        ("name = \"x\"\nconfig = \"c\"\n[grid]\n\"search.epochs\" = []\n", "no values"),
        ("name = \"x\"\nconfig = \"c\"\n[grid]\n\"search.epochs\" = 3\n", "must be a list"),
        ("name = \"x\"\nconfig = \"c\"\n[grid]\n\"search..epochs\" = [3]\n", "not a config key"),
        ("name = \"x\"\nconfig = \"c\"\nseeds = [1, 1]\n", "twice"),
        ("name = \"x\"\nconfig = \"c\"\nkind = \"bench\"\n", "kind"),
        (
            "name = \"x\"\nconfig = \"c\"\n[[variant]]\nlabel = \"a\"\n[[variant]]\nlabel = \"a\"\n",
            "labelled `a`",
        ),
        (
            "name = \"x\"\nconfig = \"c\"\n[grid]\n\"a.b\" = [1]\n[[variant]]\nlabel = \"v\"\nset = { \"a.b\" = 2 }\n",
            "both in [grid]",
        ),
        (
            "name = \"x\"\nconfig = \"c\"\n[[variant]]\nlabel = \"v\"\nset = { seed = 2 }\n",
            "`seed`",
        ),
        (
            "name = \"x\"\nconfig = \"c\"\n[grid]\n\"a.a\" = [1,2,3,4,5,6,7,8,9,10]\n\"a.b\" = [1,2,3,4,5,6,7,8,9,10]\n\"a.c\" = [1,2,3,4,5,6,7,8,9,10]\n\"a.d\" = [1,2,3,4,5,6,7,8,9,10]\n\"a.e\" = [1, 2]\n",
            "at most 10000",
        ),
    ];
    for (text, needle) in cases {
        let err = parse(text).expect_err(text);
        assert!(err.starts_with("s.toml: "), "{err}");
        assert!(err.contains(needle), "{text:?}: {err}");
    }
}

fn spec_in(dir: &Path, text: &str) -> SweepSpec {
    let text = format!("results_dir = \"{}\"\n{text}", dir.display());
    SweepSpec::parse(&text, &dir.join("s.toml")).expect("valid")
}

#[test]
fn a_sweep_folder_is_made_once_reused_when_identical_and_refused_when_different() {
    let d = scratch("dir");
    let spec = spec_in(&d, GRID);
    let s = SweepDir::create(&spec, GRID, "base = 1\n").expect("created");
    assert_eq!(s.root(), d.join("g"));
    assert_eq!(s.len(), 12);
    for f in ["trials.json", "base.toml", "sweep.toml"] {
        assert!(s.root().join(f).exists(), "{f}");
    }
    assert_eq!(s.trial_dir(3), d.join("g").join("trial-003"));
    assert_eq!(s.log(11), d.join("g").join("logs").join("trial-011.log"));
    let o = s.trial_overrides(5).expect("trial 5");
    assert!(o.contains(&"seed=8".to_string()));
    assert!(o.contains(&"name=\"g-trial-005\"".to_string()), "{o:?}");
    assert!(o.iter().any(|x| x.starts_with("record.results_dir=")));
    let err = s.trial(12).expect_err("out of range").to_string();
    assert!(err.contains("trials 0..11") && err.contains("no trial 12"), "{err}");
    // The same sweep again: reused.
    let again = SweepDir::create(&spec, GRID, "base = 1\n").expect("reused");
    assert_eq!(again.file, s.file);
    // Another base config under the same name: refused, nothing overwritten.
    let err = SweepDir::create(&spec, GRID, "base = 2\n").expect_err("different").to_string();
    assert!(err.contains("different sweep"), "{err}");
    assert_eq!(std::fs::read_to_string(s.base_config()).expect("base"), "base = 1\n");
    // Another grid under the same name: refused.
    let other = spec_in(&d, &GRID.replace("[7, 8]", "[7]"));
    assert!(SweepDir::create(&other, GRID, "base = 1\n").is_err());
    // A folder that is not a sweep.
    std::fs::create_dir_all(d.join("busy")).expect("dir");
    std::fs::write(d.join("busy").join("x"), "x").expect("file");
    let busy = spec_in(&d, &GRID.replace("name = \"g\"", "name = \"busy\""));
    let err = SweepDir::create(&busy, GRID, "").expect_err("busy").to_string();
    assert!(err.contains("not a sweep folder"), "{err}");
    let err = SweepDir::open(&d.join("busy")).expect_err("not a sweep").to_string();
    assert!(err.contains("no trials.json"), "{err}");
    // A trials.json that was edited out of order.
    let t = d.join("g").join("trials.json");
    let text =
        std::fs::read_to_string(&t).expect("read").replacen("\"trial\": 1,", "\"trial\": 9,", 1);
    std::fs::write(&t, text).expect("write");
    let err = SweepDir::open(&d.join("g")).expect_err("renumbered").to_string();
    assert!(err.contains("trial 1 is numbered 9"), "{err}");
}

#[test]
fn the_trial_number_comes_from_the_flag_then_slurm_then_kubernetes() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    let both: &[(&str, &str)] = &[("SLURM_ARRAY_TASK_ID", "3"), ("JOB_COMPLETION_INDEX", "5")];
    assert_eq!(trial_index(Some(1), env(both)).expect("flag"), 1);
    assert_eq!(trial_index(None, env(both)).expect("slurm"), 3);
    assert_eq!(trial_index(None, env(&[("JOB_COMPLETION_INDEX", " 5\n")])).expect("k8s"), 5);
    let err = trial_index(None, env(&[("SLURM_ARRAY_TASK_ID", "x")])).expect_err("bad").to_string();
    assert!(err.contains("SLURM_ARRAY_TASK_ID") && err.contains("\"x\""), "{err}");
    let err = trial_index(None, env(&[])).expect_err("none").to_string();
    assert!(err.contains("--trial"), "{err}");
}

fn slurm_opts() -> SlurmOptions {
    SlurmOptions {
        partition: Some("gpu".into()),
        time: "02:00:00".into(),
        cpus: 4,
        gpus: 1,
        mem: Some("16G".into()),
        max_running: 2,
    }
}

#[test]
fn the_slurm_script_is_an_array_over_the_trials_that_bash_accepts() {
    let d = scratch("slurm");
    let s = SweepDir::create(&spec_in(&d, GRID), GRID, "").expect("sweep");
    let cmd = TaskCommand {
        exe: PathBuf::from("/opt/q d/qdarts"),
        backend: "cuda".into(),
        workdir: d.clone(),
    };
    let text = slurm_script(&s, &cmd, &slurm_opts()).expect("script");
    for line in [
        "#SBATCH --array=0-11%2",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --partition=gpu",
        "#SBATCH --mem=16G",
        "#SBATCH --time=02:00:00",
        "#SBATCH --requeue",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
    }
    let out = format!("#SBATCH --output={}/logs/trial-%3a.log", d.join("g").display());
    assert!(text.contains(&out), "{text}");
    // The binary path with a space is quoted; the trial comes from the environment.
    let exec = format!(
        "exec '/opt/q d/qdarts' --backend 'cuda' search --sweep '{}'",
        d.join("g").display()
    );
    assert!(text.contains(&exec), "{text}");
    assert!(!text.contains("--trial"));
    // Every #SBATCH line comes before the first command, as sbatch requires.
    let first_cmd = text.lines().position(|l| !l.starts_with('#')).expect("commands");
    assert!(text.lines().skip(first_cmd).all(|l| !l.starts_with("#SBATCH")));
    let path = d.join("sweep.sbatch");
    std::fs::write(&path, &text).expect("write");
    if let Ok(o) = Command::new("bash").arg("-n").arg(&path).output() {
        assert!(o.status.success(), "bash -n: {}", String::from_utf8_lossy(&o.stderr));
    }
    // No GPU line without GPUs; no `%N` without a limit.
    let cpu = SlurmOptions { gpus: 0, max_running: 0, partition: None, mem: None, ..slurm_opts() };
    let text = slurm_script(&s, &cmd, &cpu).expect("script");
    assert!(
        !text.contains("--gres")
            && !text.contains("--partition")
            && text.contains("--array=0-11\n")
    );
    // Values that would break an #SBATCH line are refused.
    let bad = SlurmOptions { time: "1 day".into(), ..slurm_opts() };
    assert!(slurm_script(&s, &cmd, &bad).is_err());
}

fn k8s_opts() -> K8sOptions {
    K8sOptions {
        image: "registry.example/qdarts:1".into(),
        workdir: "/work".into(),
        claim: "results-pvc".into(),
        parallelism: 3,
        cpus: 4,
        gpus: 1,
        memory: "16Gi".into(),
    }
}

/// `python3 -m venv` with kubernetes-validate, when the package registry can be reached.
fn k8s_validator() -> Option<PathBuf> {
    let venv = std::env::temp_dir().join("qdarts-k8s-venv");
    let exe = venv.join("bin").join("kubernetes-validate");
    let ok = exe.exists()
        || (Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success())
            && Command::new(venv.join("bin").join("pip"))
                .args(["install", "-q", "kubernetes-validate"])
                .status()
                .is_ok_and(|s| s.success()));
    ok.then_some(exe)
}

#[test]
fn the_kubernetes_manifest_is_an_indexed_job_that_passes_the_schema() {
    let d = scratch("k8s");
    let s = SweepDir::create(&spec_in(&d, GRID), GRID, "").expect("sweep");
    let err = k8s_manifest(&s, s.root(), "cuda", &k8s_opts()).expect_err("absolute").to_string();
    assert!(err.contains("relative"), "{err}");
    let text = k8s_manifest(&s, Path::new("results/g"), "cuda", &k8s_opts()).expect("manifest");
    for needle in [
        "kind: Job",
        "completionMode: Indexed",
        "completions: 12",
        "parallelism: 3",
        "nvidia.com/gpu: \"1\"",
        "claimName: \"results-pvc\"",
        "command: [\"qdarts\", \"--backend\", \"cuda\", \"search\", \"--sweep\", \"results/g\"]",
        "mountPath: \"/work/results\"",
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }
    assert_eq!(k8s_name("My_Sweep.v2"), "qdarts-my-sweep-v2");
    assert!(k8s_name(&"x".repeat(80)).len() <= 63);
    let path = d.join("job.yaml");
    std::fs::write(&path, &text).expect("write");
    let Some(validate) = k8s_validator() else {
        qdarts_record::scratch::tool_missing("kubernetes-validate could not be installed");
        return;
    };
    let o = Command::new(&validate).arg("--strict").arg(&path).output().expect("run");
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // The validator does catch a misspelt field.
    let bad = d.join("bad.yaml");
    std::fs::write(&bad, text.replace("completionMode", "completionMod")).expect("write");
    let o = Command::new(&validate).arg("--strict").arg(&bad).output().expect("run");
    assert!(!o.status.success(), "a misspelt field passed the schema");
}

#[test]
fn stats_are_the_sample_mean_and_standard_deviation() {
    let s = Stats::of(&[0.70, 0.72, 0.74]).expect("stats");
    assert!((s.mean - 0.72).abs() < 1e-12);
    assert!((s.std - 0.02).abs() < 1e-12, "{}", s.std);
    assert_eq!(s.n, 3);
    assert_eq!(s.percent(), "72.00 ± 2.00 % (n=3)");
    let one = Stats::of(&[0.5]).expect("one");
    assert_eq!((one.std, one.percent()), (0.0, "50.00 % (n=1)".to_string()));
    assert!(Stats::of(&[]).is_none());
}

fn g(normal: &[&[(Primitive, usize)]], reduce: &[&[(Primitive, usize)]]) -> Genotype {
    let cell = |c: &[&[(Primitive, usize)]]| -> Vec<Vec<Edge>> {
        c.iter().map(|n| n.iter().map(|&e| Edge::from(e)).collect()).collect()
    };
    Genotype {
        normal: cell(normal),
        normal_concat: vec![2, 3],
        reduce: cell(reduce),
        reduce_concat: vec![2, 3],
        normal_bits: None,
        reduce_bits: None,
    }
}

#[test]
fn stability_counts_each_edge_and_op_over_genotypes() {
    use Primitive::{MaxPool3x3 as M, SepConv3x3 as S, SkipConnect as K};
    let a = g(&[&[(S, 0), (S, 1)], &[(K, 2), (S, 0)]], &[&[(M, 0), (M, 1)], &[(M, 0), (K, 2)]]);
    let b = g(&[&[(S, 0), (M, 1)], &[(K, 2), (S, 0)]], &[&[(M, 0), (M, 1)], &[(M, 0), (K, 2)]]);
    let s = Stability::of([&a, &a, &b]);
    assert_eq!((s.runs, s.distinct), (3, 2));
    assert_eq!(s.edges["normal"][&(2, 0, S)], 3);
    assert_eq!(s.edges["normal"][&(2, 1, S)], 2);
    assert_eq!(s.edges["normal"][&(2, 1, M)], 1);
    assert_eq!(s.edges["reduce"][&(3, 2, K)], 3);
    // a has three sep3 edges (counted twice), b two.
    assert_eq!(s.ops["normal"][&S], 3 * 2 + 2);
    assert_eq!(s.ops["reduce"].values().sum::<usize>(), 12);
    let lines = s.lines().join("\n");
    assert!(lines.contains("normal node 2: sep3(0) 3/3, sep3(1) 2/3, max3(1) 1/3"), "{lines}");
}

fn summary(dir: &str, seed: u64, lr: &str, top1: Option<f64>, baseline: bool) -> RunSummary {
    let config: BTreeMap<String, String> = [
        ("name".to_string(), dir.to_string()),
        ("seed".to_string(), seed.to_string()),
        ("search.alpha_lr".to_string(), lr.to_string()),
        ("search.epochs".to_string(), "6".to_string()),
    ]
    .into_iter()
    .collect();
    RunSummary {
        dir: PathBuf::from(dir),
        kind: "search",
        config,
        epochs_done: 6,
        epochs_planned: Some(6),
        steps: 60,
        top1,
        seconds: 10.0,
        genotype: None,
        eval: None,
        baseline,
        source_config: None,
    }
}

/// A finished training run of a genotype with a seed and a final top-1.
fn trained(dir: &str, genotype: &str, seed: u64, top1: f64, baseline: bool) -> RunSummary {
    let mut r = summary(dir, seed, "x", Some(top1), baseline);
    r.kind = "train";
    r.config.remove("search.alpha_lr");
    r.config.remove("search.epochs");
    r.config.insert("genotype".into(), genotype.into());
    r.config.insert("train.lr".into(), "0.05".into());
    r
}

/// The same, its genotype from a search run with this guard setting.
fn searched(dir: &str, genotype: &str, seed: u64, top1: f64, smoothing: &str) -> RunSummary {
    let mut r = trained(dir, genotype, seed, top1, false);
    let source = [
        ("name".to_string(), format!("search-{genotype}")),
        ("seed".to_string(), genotype.to_string()),
        ("search.guards.random_smoothing".to_string(), smoothing.to_string()),
    ];
    r.source_config = Some(source.into_iter().collect());
    r
}

#[test]
fn runs_that_differ_only_in_their_seed_form_a_group() {
    let c = Comparison::new(vec![
        summary("a", 1, "0.01", Some(0.70), false),
        summary("b", 2, "0.01", Some(0.74), false),
        summary("c", 1, "0.003", Some(0.60), false),
        summary("d", 2, "0.003", None, false),
    ]);
    // `name` differs by construction and is no difference; `search.epochs` is equal.
    assert_eq!(c.varying, ["search.alpha_lr", "seed"]);
    assert_eq!(c.groups.len(), 2);
    assert_eq!(c.groups[0].members, [0, 1]);
    assert_eq!(c.groups[0].label, "search.alpha_lr=0.01");
    let s = c.groups[0].top1.expect("stats");
    assert!((s.mean - 0.72).abs() < 1e-12 && s.n == 2);
    // The run without a validation row is counted out of the mean.
    assert_eq!(c.groups[1].top1.expect("stats").n, 1);
    let table = csv(&c).expect("csv");
    let mut lines = table.lines();
    assert_eq!(
        lines.next(),
        Some(
            "run,dir,group,baseline,kind,search.alpha_lr,seed,finished,epochs_done,epochs_planned,steps,top1,integer_top1,agreement,bitops,param_bytes,seconds,genotype"
        )
    );
    assert_eq!(lines.next(), Some("a,a,G1,false,search,0.01,1,true,6,6,60,0.700000,,,,,10.000,"));
    assert_eq!(table.lines().count(), 5);
    assert!(baseline_summary(&c).is_none());
}

#[test]
fn the_baseline_summary_compares_methods_with_random_genotypes_genotype_by_genotype() {
    // Search runs are not training runs: no baseline analysis of them.
    let c = Comparison::new(vec![
        summary("s1", 1, "x", Some(0.76), false),
        summary("r1", 1, "x", Some(0.70), true),
    ]);
    assert!(baseline_summary(&c).is_none());
    // Two genotypes a side, seeds 1 and 2 each: seeds shared, so the two-way analysis.
    // Seed means 0.77, 0.81 against 0.71, 0.73 (balanced: adjusted means are the seed means).
    let runs = vec![
        trained("s1", "a", 1, 0.76, false),
        trained("s2", "a", 2, 0.78, false),
        trained("s3", "b", 1, 0.80, false),
        trained("s4", "b", 2, 0.82, false),
        trained("r1", "x", 1, 0.70, true),
        trained("r2", "x", 2, 0.72, true),
        trained("r3", "y", 1, 0.74, true),
        trained("r4", "y", 2, 0.72, true),
    ];
    let c = Comparison::new(runs.clone());
    assert!(c.training_mismatch().is_empty());
    let a = c.analysis().expect("analysis");
    assert_eq!(a.methods.len(), 1);
    let m = &a.methods[0];
    let mut scores = m.scores.clone();
    scores.sort_by(f64::total_cmp);
    assert!((scores[0] - 0.77).abs() < 1e-12 && (scores[1] - 0.81).abs() < 1e-12, "{scores:?}");
    // se √(0.0008/2 + 0.0002/2), Welch–Satterthwaite df 0.0005² / (0.0004² + 0.0001²) = 1.47.
    let w = m.welch.expect("welch");
    assert!((w.diff - 0.07).abs() < 1e-12 && (w.df - 1.470_588).abs() < 1e-6, "{w:?}");
    // Both searched genotypes beat both random ones: U = 4 of 4, exact p = 2/6.
    let u = m.mann_whitney.expect("mann-whitney");
    assert_eq!((u.u, u.p_greater), (4.0, 1.0));
    assert!((u.p - 1.0 / 3.0).abs() < 1e-12);
    // Of the 6 splits of four scores, 2 are as extreme: p = 2 · 1/6.
    let p = m.permutation.expect("permutation");
    assert!(p.exact && p.resamples == 6 && (p.p - 1.0 / 3.0).abs() < 1e-12, "{p:?}");
    // One method: Holm changes nothing.
    assert_eq!(m.holm[0], Some(w.p));
    let s = baseline_summary(&c).expect("summary");
    assert!(s.contains("two-way ANOVA, seed a crossed block, 4 genotypes"), "{s}");
    assert!(s.contains("searched  2 genotypes, 4 runs, mean 79.00 %"), "{s}");
    assert!(s.contains("difference +7.00 points, 95 % CI ["), "{s}");
    assert!(!s.contains("beats"), "{s}");

    // An unfinished run counts in no statistic, though its last validation row is high.
    let mut late = trained("s5", "c", 1, 0.99, false);
    late.epochs_done = 2;
    let mut with_late = runs.clone();
    with_late.push(late);
    let c = Comparison::new(with_late);
    assert_eq!(c.unfinished(), [8]);
    assert_eq!(c.runs[8].state(), "2 of 6 epochs (running or stopped)");
    let a = c.analysis().expect("analysis");
    assert_eq!(a.units.len(), 4);
    assert!((a.methods[0].welch.expect("welch").diff - 0.07).abs() < 1e-12);
    assert!(report(&c).contains("unfinished, left out of every statistic:\n  s5: 2 of 6"));

    // A side trained with another learning rate is named, with both values.
    let mut odd = runs.clone();
    odd[5].config.insert("train.lr".into(), "0.1".into());
    odd[5].config.insert("record.checkpoint_every".into(), "7".into());
    let c = Comparison::new(odd);
    assert_eq!(
        c.training_mismatch(),
        [("train.lr".to_string(), vec!["0.05".into(), "0.1".into()])]
    );
}

#[test]
fn methods_come_from_the_search_configs_and_holm_corrects_across_them() {
    let mut runs = Vec::new();
    for (g, top1, smoothing) in [
        ("a", 0.80, "0.3"),
        ("b", 0.81, "0.3"),
        ("c", 0.82, "0.3"),
        ("d", 0.74, "0.0"),
        ("e", 0.75, "0.0"),
        ("f", 0.73, "0.0"),
    ] {
        runs.push(searched(&format!("run-{g}"), g, 1, top1, smoothing));
    }
    for (g, top1) in [("x", 0.72), ("y", 0.74), ("z", 0.73), ("w", 0.75)] {
        runs.push(trained(&format!("run-{g}"), g, 1, top1, true));
    }
    let c = Comparison::new(runs);
    let a = c.analysis().expect("analysis");
    let labels: Vec<&str> = a.methods.iter().map(|m| m.label.as_str()).collect();
    assert_eq!(
        labels,
        ["search.guards.random_smoothing=0.3", "search.guards.random_smoothing=0.0"]
    );
    assert!(a.method_note.is_none());
    // One seed everywhere: no two-way fit, and no seed noise to estimate.
    assert!(a.noise.is_none());
    let welch: Vec<f64> = a.methods.iter().map(|m| m.welch.expect("welch").p).collect();
    let holm = qdarts_sweep::stats::holm(&welch);
    for (m, h) in a.methods.iter().zip(holm) {
        assert_eq!(m.holm[0], Some(h));
        assert!(m.holm[0] >= m.welch.map(|w| w.p));
    }
    let table = qdarts_sweep::compare::stats_csv(&c).expect("csv").expect("rows");
    let mut lines = table.lines();
    assert!(
        lines.next().expect("head").starts_with("method,genotypes,runs,mean,baseline_genotypes")
    );
    assert!(lines.next().expect("row").starts_with(
        "search.guards.random_smoothing=0.3,3,3,0.810000,4,0.735000,seed_mean,0.075000,0.950000,"
    ));
    assert_eq!(table.lines().count(), 3);
}

#[test]
fn a_paired_comparison_sets_genotypes_from_the_same_search_seed_against_each_other() {
    // Quantization-aware searches (method) against float ones (baseline), seeds 1-4 and a
    // fifth quantized search with no float partner; scored by the integer model.
    let run = |dir: &str, seed: &str, preset: &str, top1: f64, baseline: bool| {
        let mut r = searched(dir, dir, 1, 0.5, "0.0");
        r.baseline = baseline;
        let source = r.source_config.as_mut().expect("source");
        source.insert("seed".into(), seed.into());
        source.insert("quant.preset".into(), preset.into());
        source.remove("search.guards.random_smoothing");
        r.eval = Some(qdarts_sweep::compare::EvalSummary {
            integer_top1: top1,
            agreement: 1.0,
            bitops: 1,
            param_bytes: 1,
        });
        r
    };
    let mut runs = Vec::new();
    for (seed, q, f) in
        [("1", 0.861, 0.858), ("2", 0.850, 0.851), ("3", 0.866, 0.860), ("4", 0.855, 0.853)]
    {
        runs.push(run(&format!("q{seed}"), seed, "tensorrt", q, false));
        runs.push(run(&format!("f{seed}"), seed, "float", f, true));
    }
    runs.push(run("q5", "5", "tensorrt", 0.9, false));
    // A finished run without eval.json: not scored under the integer score.
    let mut plain = run("q6", "6", "tensorrt", 0.9, false);
    plain.eval = None;
    runs.push(plain);
    let options = Options { score: Score::Integer, paired: true, margin: Some(0.005) };
    let c = Comparison::with_options(runs, options);
    assert_eq!(c.unscored(), [9]);
    let a = c.analysis().expect("analysis");
    let p = a.methods[0].paired.as_ref().expect("paired");
    assert_eq!(p.pairs.len(), 4);
    assert_eq!(p.unpaired, 1);
    // Differences +0.3, −0.1, +0.6, +0.2 points: mean +0.25.
    let t = p.t.expect("paired t");
    assert!((t.mean - 0.0025).abs() < 1e-12 && t.df == 3.0, "{t:?}");
    // Three of four positive: W+ = 2 + 3 + 4 = 9 of 10 (ranks of 0.1, 0.2, 0.3, 0.6: 1..4).
    let w = p.wilcoxon.expect("wilcoxon");
    assert_eq!((w.w_plus, w.statistic, w.n), (9.0, 1.0, 4));
    let f = p.sign_flip.expect("sign flips");
    assert!(f.exact && f.resamples == 16);
    let (margin, q) = p.equivalence.expect("equivalence");
    assert_eq!(margin, 0.005);
    assert!((0.0..=1.0).contains(&q));
    let text = baseline_summary(&c).expect("summary");
    assert!(text.contains("scored by its seeds' mean integer model top-1"), "{text}");
    assert!(
        text.contains("paired by search seed: 4 pairs (1 of the method's genotypes unpaired)"),
        "{text}"
    );
    assert!(text.contains("equivalence within ±0.50 points"), "{text}");
    assert!(report(&c).contains("finished but not evaluated (no eval.json), left out:\n  q6"));
}

#[test]
fn the_shipped_sweep_files_expand() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
    for (file, kind, trials) in [
        ("sweep-default.toml", TrialKind::Search, 4),
        ("sweep-guards.toml", TrialKind::Search, 9),
        ("sweep-baseline.toml", TrialKind::Train, 34),
    ] {
        let s = SweepSpec::load(&dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!((s.kind, s.trials.len()), (kind, trials), "{file}");
        assert!(dir.join("..").join(&s.config).exists(), "{file}: {}", s.config.display());
    }
}
