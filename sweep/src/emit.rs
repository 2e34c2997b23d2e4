//! Files that run a sweep's trials on an existing scheduler: a Slurm array script (one array
//! task per trial) and a Kubernetes Indexed Job (one completion index per trial). Each task
//! runs `qdarts <search|train> --sweep <folder>`, which reads its trial number from
//! `SLURM_ARRAY_TASK_ID` or `JOB_COMPLETION_INDEX` and resumes the trial's run folder when a
//! requeued task or restarted pod finds it.

use std::path::{Path, PathBuf};

use crate::SweepError;
use crate::trials::SweepDir;

/// The command a task runs.
#[derive(Debug, Clone)]
pub struct TaskCommand {
    /// The qdarts binary.
    pub exe: PathBuf,
    /// `--backend`.
    pub backend: String,
    /// Working directory (relative config, data and genotype paths are read from here).
    pub workdir: PathBuf,
}

/// Slurm settings.
#[derive(Debug, Clone)]
pub struct SlurmOptions {
    /// `--partition`.
    pub partition: Option<String>,
    /// `--time` (`[D-]HH:MM:SS`).
    pub time: String,
    /// `--cpus-per-task` (also the trial's threads).
    pub cpus: usize,
    /// GPUs per task (`--gres=gpu:N`); 0 for none.
    pub gpus: usize,
    /// `--mem`, e.g. `16G`.
    pub mem: Option<String>,
    /// At most this many tasks at once (`--array=…%N`); 0 for no limit.
    pub max_running: usize,
}

/// Kubernetes settings.
#[derive(Debug, Clone)]
pub struct K8sOptions {
    /// Container image holding the qdarts binary (on `PATH`) and the working tree.
    pub image: String,
    /// Working directory inside the image.
    pub workdir: String,
    /// Persistent volume claim mounted on the results folder.
    pub claim: String,
    /// Pods at once.
    pub parallelism: usize,
    /// CPUs per pod (also the trial's threads).
    pub cpus: usize,
    /// GPUs per pod (`nvidia.com/gpu`); 0 for none.
    pub gpus: usize,
    /// Memory request, e.g. `16Gi`.
    pub memory: String,
}

/// A string in single quotes for bash.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn check_slurm_value(what: &str, v: &str) -> Result<(), SweepError> {
    if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c == '\'' || c == '"' || c == '#') {
        return Err(SweepError::Other(format!("{what} {v:?}: no spaces, quotes or `#`")));
    }
    Ok(())
}

fn absolute(p: &Path, workdir: &Path) -> PathBuf {
    if p.is_absolute() { p.to_path_buf() } else { workdir.join(p) }
}

/// The `sbatch` array script of a sweep.
pub fn slurm_script(
    sweep: &SweepDir,
    cmd: &TaskCommand,
    opt: &SlurmOptions,
) -> Result<String, SweepError> {
    check_slurm_value("--time", &opt.time)?;
    if let Some(p) = &opt.partition {
        check_slurm_value("--partition", p)?;
    }
    if let Some(m) = &opt.mem {
        check_slurm_value("--mem", m)?;
    }
    let root = absolute(sweep.root(), &cmd.workdir);
    for (what, p) in [("sweep folder", &root), ("working directory", &cmd.workdir)] {
        let s = p.display().to_string();
        if s.chars().any(|c| c.is_whitespace() || c == '%') {
            return Err(SweepError::Other(format!(
                "the {what} {s:?} has a space or `%`, which #SBATCH lines cannot hold"
            )));
        }
    }
    let n = sweep.len();
    let width = sweep.width();
    let limit = if opt.max_running > 0 { format!("%{}", opt.max_running) } else { String::new() };
    let mut s = String::new();
    s.push_str("#!/bin/bash\n");
    s.push_str(&format!(
        "# qdarts sweep `{}`: {n} {} trials, one array task each.\n",
        sweep.file.name,
        sweep.file.kind.command()
    ));
    s.push_str(&format!("# Submit with: sbatch {}\n", root.join("sweep.sbatch").display()));
    s.push_str("# A requeued or resubmitted task resumes its trial from the last checkpoint;\n");
    s.push_str("# a finished trial is not run again.\n");
    s.push_str(&format!("#SBATCH --job-name=qdarts-{}\n", sweep.file.name));
    s.push_str(&format!("#SBATCH --array=0-{}{limit}\n", n - 1));
    s.push_str(&format!("#SBATCH --chdir={}\n", cmd.workdir.display()));
    s.push_str(&format!("#SBATCH --output={}/logs/trial-%{width}a.log\n", root.display()));
    s.push_str("#SBATCH --open-mode=append\n");
    s.push_str("#SBATCH --ntasks=1\n");
    s.push_str(&format!("#SBATCH --cpus-per-task={}\n", opt.cpus.max(1)));
    s.push_str(&format!("#SBATCH --time={}\n", opt.time));
    s.push_str("#SBATCH --requeue\n");
    if opt.gpus > 0 {
        s.push_str(&format!("#SBATCH --gres=gpu:{}\n", opt.gpus));
    }
    if let Some(p) = &opt.partition {
        s.push_str(&format!("#SBATCH --partition={p}\n"));
    }
    if let Some(m) = &opt.mem {
        s.push_str(&format!("#SBATCH --mem={m}\n"));
    }
    s.push_str("set -euo pipefail\n");
    s.push_str(&format!(
        "export RAYON_NUM_THREADS=\"${{SLURM_CPUS_PER_TASK:-{}}}\"\n",
        opt.cpus.max(1)
    ));
    s.push_str(&format!(
        "exec {} --backend {} {} --sweep {}\n",
        sh_quote(&cmd.exe.display().to_string()),
        sh_quote(&cmd.backend),
        sweep.file.kind.command(),
        sh_quote(&root.display().to_string())
    ));
    Ok(s)
}

/// A string as a YAML double-quoted scalar (JSON's escapes are YAML's).
fn yq(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A Kubernetes object name from the sweep name: lower case, `-` for anything else, at most
/// 63 characters, starting and ending with a letter or digit.
pub fn k8s_name(sweep: &str) -> String {
    let mut n: String = format!("qdarts-{sweep}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect();
    n.truncate(63);
    n.trim_end_matches('-').to_string()
}

/// The Indexed Job manifest (YAML) of a sweep whose folder is `rel` relative to the working
/// directory (inside the image, the results volume is mounted at the folder above it).
pub fn k8s_manifest(
    sweep: &SweepDir,
    rel: &Path,
    backend: &str,
    opt: &K8sOptions,
) -> Result<String, SweepError> {
    if rel.is_absolute() {
        return Err(SweepError::Other(format!(
            "{}: a Kubernetes sweep needs a results folder relative to the working directory \
             (set `results_dir` in the sweep file to a relative path)",
            rel.display()
        )));
    }
    let results = rel.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mount = format!("{}/{}", opt.workdir.trim_end_matches('/'), results.display());
    let n = sweep.len();
    let name = k8s_name(&sweep.file.name);
    let cmd = [
        "qdarts".to_string(),
        "--backend".into(),
        backend.into(),
        sweep.file.kind.command().into(),
        "--sweep".into(),
        rel.display().to_string(),
    ];
    let cmd: Vec<String> = cmd.iter().map(|c| yq(c)).collect();
    let mut limits = format!("              cpu: {}\n", yq(&opt.cpus.max(1).to_string()));
    if opt.gpus > 0 {
        limits.push_str(&format!("              nvidia.com/gpu: {}\n", yq(&opt.gpus.to_string())));
    }
    Ok(format!(
        "# qdarts sweep `{sweep_name}`: {n} {kind} trials as a Kubernetes Indexed Job; the pod of\n\
         # completion index i runs trial i (JOB_COMPLETION_INDEX). The image holds qdarts on PATH\n\
         # and the working tree (experiments/, data); the results folder is a persistent volume, so\n\
         # a restarted pod resumes its trial from the last checkpoint.\n\
         # Apply with: kubectl apply -f {file}\n\
         apiVersion: batch/v1\n\
         kind: Job\n\
         metadata:\n  \
           name: {name}\n  \
           labels:\n    \
             app.kubernetes.io/name: qdarts\n    \
             qdarts.sweep: {label}\n\
         spec:\n  \
           completionMode: Indexed\n  \
           completions: {n}\n  \
           parallelism: {par}\n  \
           backoffLimit: {backoff}\n  \
           template:\n    \
             metadata:\n      \
               labels:\n        \
                 app.kubernetes.io/name: qdarts\n    \
             spec:\n      \
               restartPolicy: OnFailure\n      \
               containers:\n        \
                 - name: trial\n          \
                   image: {image}\n          \
                   workingDir: {workdir}\n          \
                   command: [{cmd}]\n          \
                   env:\n            \
                     - name: RAYON_NUM_THREADS\n              \
                       value: {threads}\n          \
                   resources:\n            \
                     requests:\n              \
                       cpu: {threads}\n              \
                       memory: {memory}\n            \
                     limits:\n{limits}          \
                   volumeMounts:\n            \
                     - name: results\n              \
                       mountPath: {mount}\n      \
               volumes:\n        \
                 - name: results\n          \
                   persistentVolumeClaim:\n            \
                     claimName: {claim}\n",
        sweep_name = sweep.file.name,
        kind = sweep.file.kind.command(),
        file = rel.join("job.yaml").display(),
        label = yq(&name),
        par = opt.parallelism.clamp(1, n.max(1)),
        backoff = 3 * n,
        image = yq(&opt.image),
        workdir = yq(&opt.workdir),
        cmd = cmd.join(", "),
        threads = yq(&opt.cpus.max(1).to_string()),
        memory = yq(&opt.memory),
        mount = yq(&mount),
        claim = yq(&opt.claim),
    ))
}
