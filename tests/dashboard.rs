//! The dashboard on a real run record: a short search writes it (with an injected NaN), the
//! reader's state is checked against the files read independently here, and the panels are
//! drawn on ratatui's `TestBackend` at full and tiny sizes.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use burn::tensor::Device;
use qdarts_engine::config::Experiment;
use qdarts_engine::{InjectSite, NanInjection};
use qdarts_search::config::ExperimentConfig;
use qdarts_search::{prepare_search, run_prepared};
use qdarts_tui::app::{App, Tab};
use qdarts_tui::state::RunStatus;
use qdarts_tui::{Action, RunReader};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent};

/// One short search per test binary: 3 epochs of 3 steps, a NaN injected into the gradients at
/// step 4, quantization errors every 2 steps.
fn run() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = qdarts_record::scratch::scratch_path("dash");
        let text = format!(
            r#"
            name = "dash"
            seed = 3
            [data]
            dataset = "fashion-mnist"
            limit = 96
            [model]
            init_channels = 2
            layers = 3
            nodes = 2
            stem_multiplier = 1
            [search]
            epochs = 3
            batch_size = 8
            steps_per_epoch = 3
            alpha_lr = 0.05
            [record]
            results_dir = "{}"
            quant_error_every = 2
            "#,
            dir.display()
        );
        let cfg = ExperimentConfig::parse(&text, Path::new("dash.toml"), &[]).unwrap();
        let device = Device::flex();
        let at = NanInjection { step: 4, site: InjectSite::Grad };
        let prepared = prepare_search(&cfg, &device).unwrap().inject_nan(at);
        let run = qdarts_record::RunDir::create(&cfg.record.results_dir, &cfg.name).unwrap();
        let go = &mut |_: &_| ControlFlow::Continue(());
        run_prepared(prepared, run, false, go).unwrap().run_dir
    })
}

fn csv_rows(file: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(run().join(file)).unwrap();
    text.lines().skip(1).map(|l| l.split(',').map(String::from).collect()).collect()
}

fn screen(app: &App, w: u16, h: u16, reader: &RunReader) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| app.render(reader.state(), None, f.area(), f.buffer_mut())).unwrap();
    let buf = term.backend().buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

#[test]
fn the_reader_holds_what_the_files_hold() {
    let mut reader = RunReader::open(run()).unwrap();
    reader.poll().unwrap();
    let s = reader.state();
    let metrics = csv_rows("metrics.csv");
    let train: Vec<&Vec<String>> = metrics.iter().filter(|r| r[2] == "train").collect();
    assert_eq!(s.train.len(), train.len());
    assert_eq!(s.val.len(), metrics.len() - train.len());
    let last: f64 = train.last().unwrap()[3].parse().unwrap();
    assert_eq!(s.last().unwrap().loss, last);
    assert_eq!(s.status, RunStatus::Finished);
    assert_eq!(s.total_steps(), Some(9));
    assert_eq!(s.skipped_rows, 0);

    let nan = csv_rows("nan_events.csv");
    assert_eq!(s.nan.len(), nan.len());
    assert_eq!((s.nan[0].step, s.nan[0].site.name()), (4, "grad"));

    // Quantizers at the last recorded step, and the lowest SQNR among them.
    let quant = csv_rows("quant_error.csv");
    let last_step = quant.iter().map(|r| r[1].parse::<usize>().unwrap()).max().unwrap();
    let at_last: Vec<&Vec<String>> =
        quant.iter().filter(|r| r[1].parse::<usize>().unwrap() == last_step).collect();
    assert_eq!(s.quant_step, last_step);
    assert_eq!(s.current_quant().count(), at_last.len());
    let worst = at_last
        .iter()
        .min_by(|a, b| a[8].parse::<f64>().unwrap().total_cmp(&b[8].parse::<f64>().unwrap()))
        .unwrap();
    assert_eq!(s.worst_quant().unwrap().error.layer, worst[2]);

    // α: one row per (epoch, cell, edge, op).
    let alphas = csv_rows("alphas.csv");
    assert_eq!(s.alphas.len(), 3);
    let cells: usize = s.alphas.iter().map(|a| a.normal.len() + a.reduce.len()).sum();
    assert_eq!(cells * s.ops.len(), alphas.len());
    let genotype = std::fs::read_to_string(run().join("genotype.txt")).unwrap();
    assert_eq!(s.current_genotype(), Some(genotype.trim()));
}

#[test]
fn the_overview_shows_loss_nan_count_quant_layers_and_genotype() {
    let mut reader = RunReader::open(run()).unwrap();
    reader.poll().unwrap();
    let app = App::new(20.0);
    let text = screen(&app, 160, 48, &reader);
    assert!(text.contains("loss") && text.contains("train loss"), "{text}");
    assert!(text.contains("NaN events  1 "), "{text}");
    let worst = reader.state().worst_quant().unwrap().error.layer.clone();
    assert!(text.contains(&worst), "worst layer {worst} not on screen:\n{text}");
    // The genotype's first normal node, as pt.darts' text has it.
    let g = qdarts_genotypes::Genotype::from_darts_text(
        &std::fs::read_to_string(run().join("genotype.txt")).unwrap(),
    )
    .unwrap();
    let e = &g.normal[0];
    let node = format!("node 2: {} ← {}, {} ← {}", e[0].op, e[0].input, e[1].op, e[1].input);
    assert!(text.contains(&node), "{node} not on screen:\n{text}");
    assert!(text.contains("epoch 3/3") && text.contains("finished"), "{text}");
}

#[test]
fn every_tab_draws_at_every_size_without_panicking() {
    let mut reader = RunReader::open(run()).unwrap();
    reader.poll().unwrap();
    let mut app = App::new(20.0);
    for tab in Tab::ALL {
        app.tab = tab;
        for (w, h) in [(1, 1), (20, 5), (2, 40), (40, 12), (80, 24), (250, 70)] {
            let text = screen(&app, w, h, &reader);
            assert_eq!(text.lines().count(), usize::from(h));
        }
    }
    // The NaN tab lists the injected event with its layer.
    app.tab = Tab::Nan;
    let text = screen(&app, 120, 20, &reader);
    let layer = &csv_rows("nan_events.csv")[0][3];
    assert!(text.contains(layer.as_str()) && text.contains("skipped"), "{text}");
    // The α tab shows the strongest op's weight of the first edge as written in alphas.csv.
    app.tab = Tab::Alphas;
    let text = screen(&app, 120, 30, &reader);
    let first_edge: Vec<Vec<String>> = csv_rows("alphas.csv")
        .into_iter()
        .filter(|r| r[0] == "2" && r[1] == "normal" && r[2] == "0")
        .collect();
    for r in &first_edge {
        let w: f64 = r[4].parse().unwrap();
        assert!(text.contains(&format!("{w:.3}")), "{w:.3} missing:\n{text}");
    }
}

#[test]
fn keys_switch_tabs_sort_and_ask_before_quitting_a_running_search() {
    let mut app = App::new(20.0);
    let key = |c| KeyEvent::from(c);
    assert_eq!(app.key(key(KeyCode::Tab), false), Action::None);
    assert_eq!(app.tab, Tab::Quant);
    app.key(key(KeyCode::Char('5')), false);
    assert_eq!(app.tab, Tab::Nan);
    app.key(key(KeyCode::BackTab), false);
    assert_eq!(app.tab, Tab::Genotype);
    assert_eq!(app.key(key(KeyCode::Char('q')), false), Action::Quit);
    // With a search running, q asks; Esc goes back, k keeps it running, s stops it.
    assert_eq!(app.key(key(KeyCode::Char('q')), true), Action::None);
    assert!(app.confirm_quit);
    assert_eq!(app.key(key(KeyCode::Esc), true), Action::None);
    assert!(!app.confirm_quit);
    app.key(key(KeyCode::Char('q')), true);
    assert_eq!(app.key(key(KeyCode::Char('k')), true), Action::KeepRunning);
    app.confirm_quit = false;
    app.key(key(KeyCode::Char('q')), true);
    assert_eq!(app.key(key(KeyCode::Char('s')), true), Action::StopSearch);
}

/// The run's tables cut in the middle of a line and followed by junk (binary bytes, rows of the
/// wrong width, NaN and huge values, an unknown quantizer kind, a header alone), and a second
/// copy whose tables are junk throughout: every tab draws at 80×24 and 40×10, the malformed
/// rows are counted as skipped, and the rows before the cut still show.
#[test]
fn truncated_and_garbage_tables_draw_at_small_sizes() {
    let copy = |name: &str| {
        let dir = qdarts_record::scratch::scratch(&format!("dash-{name}"));
        for e in std::fs::read_dir(run()).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
            }
        }
        dir
    };
    let tables =
        ["metrics.csv", "alphas.csv", "genotypes.csv", "quant_error.csv", "nan_events.csv"];
    let junk: &[u8] = b"\xff\xfe\x00garbage\n1,2\n0,1,train,NaN,1e308,-1,inf,x\n\
        0,3,cells.0.x,bogus_kind,8,1e-3,0,1e-5,30.000,0.000000\n,,,,,,,,,,,,,,,,\n\"unclosed,1\n";
    let cut = copy("cut");
    for t in tables {
        let p = cut.join(t);
        let bytes = std::fs::read(&p).unwrap();
        let mut half = bytes[..bytes.len() / 2].to_vec();
        half.push(b'\n');
        half.extend_from_slice(junk);
        std::fs::write(&p, half).unwrap();
    }
    let trash = copy("trash");
    for t in tables {
        std::fs::write(trash.join(t), junk).unwrap();
    }
    std::fs::write(trash.join("alphas.csv"), "epoch,cell_type,edge,op,weight\n").unwrap();

    for (dir, keeps_rows) in [(&cut, true), (&trash, false)] {
        let mut reader = RunReader::open(dir).unwrap();
        reader.poll().unwrap();
        let s = reader.state();
        assert!(s.skipped_rows > 0, "{}: no malformed row counted", dir.display());
        assert_eq!(!s.train.is_empty(), keeps_rows, "{}", dir.display());
        let mut app = App::new(20.0);
        for tab in Tab::ALL {
            app.tab = tab;
            for (w, h) in [(80, 24), (40, 10)] {
                let text = screen(&app, w, h, &reader);
                assert_eq!(text.lines().count(), usize::from(h), "{tab:?} at {w}x{h}");
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
