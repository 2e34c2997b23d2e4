//! Every picture of a run and of a comparison is a PNG that decodes to its size with more than
//! one colour, and an SVG that parses, with the cells' op names as text.

use std::path::{Path, PathBuf};

use qdarts_genotypes::{Genotype, known};
use qdarts_plot::across::plot_comparison;
use qdarts_plot::cell::{Cell, Renderer, dot_available, draw_cell, to_dot};
use qdarts_plot::run::{edge_ends, plot_run};
use qdarts_record::{
    AlphaRow, CellType, MetricsRow, Phase, QuantError, QuantErrorRow, TableWriter, TensorRole,
};
use qdarts_sweep::compare::{Comparison, read_run};

fn scratch(name: &str) -> PathBuf {
    qdarts_record::scratch::scratch(&format!("plot-{name}"))
}

/// A search run record of 3 epochs × 4 steps, DARTS_V2 as its genotype.
fn fake_run(dir: &Path, seed: u64, shift: f64) -> Genotype {
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(
        dir.join("config.toml"),
        format!("name = \"r\"\nseed = {seed}\n[search]\nepochs = 3\n"),
    )
    .expect("config");
    std::fs::write(dir.join("plan.json"), r#"{"epochs":3,"steps_per_epoch":4}"#).expect("plan");
    let mut m = TableWriter::<MetricsRow>::open(&dir.join("metrics.csv")).expect("metrics");
    let mut a = TableWriter::<AlphaRow>::open(&dir.join("alphas.csv")).expect("alphas");
    let mut q = TableWriter::<QuantErrorRow>::open(&dir.join("quant_error.csv")).expect("quant");
    let g = known("DARTS_V2").expect("DARTS_V2");
    let ops = ["none", "max_pool_3x3", "sep_conv_3x3", "skip_connect"];
    for epoch in 0..3 {
        for s in 0..4 {
            let step = epoch * 4 + s + 1;
            let row = MetricsRow {
                epoch,
                step,
                phase: Phase::Train,
                loss: 2.0 / step as f64,
                top1: 0.1 + 0.05 * step as f64,
                lr: 0.025,
                arch_lr: 3e-4,
                seconds: step as f64,
            };
            m.push(&row).expect("row");
            for (l, kind) in
                [TensorRole::Weight, TensorRole::Act, TensorRole::Act].iter().enumerate()
            {
                q.push(&QuantErrorRow {
                    epoch,
                    step,
                    error: QuantError {
                        layer: format!("cells.0.edges.{l}.x"),
                        kind: *kind,
                        bits: 8,
                        scale: 0.01,
                        zero_point: 0.0,
                        mse: 1e-5,
                        sqnr_db: if l == 2 { 200.0 } else { 30.0 + step as f64 + l as f64 },
                        clip_frac: 0.0,
                    },
                })
                .expect("quant row");
            }
        }
        let val = MetricsRow {
            epoch,
            step: epoch * 4 + 4,
            phase: Phase::Val,
            loss: 1.0 / (epoch + 1) as f64,
            top1: 0.5 + 0.1 * epoch as f64 + shift,
            lr: 0.025,
            arch_lr: 3e-4,
            seconds: 5.0,
        };
        m.push(&val).expect("val");
        for cell_type in [CellType::Normal, CellType::Reduce] {
            for edge in 0..14 {
                for (k, op) in ops.iter().enumerate() {
                    let w = (k as f64 + 1.0 + epoch as f64 * (k == 2) as u8 as f64) / 12.0;
                    a.push(&AlphaRow { epoch, cell_type, edge, op: (*op).into(), weight: w })
                        .expect("alpha");
                }
            }
        }
    }
    std::fs::write(dir.join("genotype.json"), g.to_json().expect("json")).expect("genotype");
    g
}

fn check_png(path: &Path) -> (u32, u32) {
    let file = std::fs::File::open(path).expect("png file");
    let decoder = png::Decoder::new(std::io::BufReader::new(file));
    let mut reader = decoder.read_info().expect("png header");
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("png data");
    let pixels = &buf[..info.buffer_size()];
    let px = info.color_type.samples();
    let first = &pixels[..px];
    assert!(pixels.chunks(px).any(|p| p != first), "{}: one colour only", path.display());
    (info.width, info.height)
}

fn svg_texts(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("svg");
    // graphviz writes a DOCTYPE.
    let opt = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    let doc = roxmltree::Document::parse_with_options(&text, opt).expect("svg parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg", "{}", path.display());
    doc.descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| {
            let t: String =
                n.descendants().filter(|c| c.is_text()).filter_map(|c| c.text()).collect();
            let t = t.trim().to_string();
            (!t.is_empty()).then_some(t)
        })
        .collect()
}

#[test]
fn a_run_gives_cells_curves_alphas_and_quantization_error_as_png_and_svg() {
    let d = scratch("run");
    let run = d.join("run");
    let g = fake_run(&run, 1, 0.0);
    let out = d.join("plots");
    let files = plot_run(&run, &out, Renderer::Builtin).expect("plotted");
    let names: Vec<String> =
        files.iter().map(|f| f.file_name().expect("name").to_string_lossy().into()).collect();
    for stem in ["normal", "reduce", "curves", "alphas-normal", "alphas-reduce", "quant-error"] {
        for ext in ["svg", "png"] {
            assert!(names.contains(&format!("{stem}.{ext}")), "{stem}.{ext} missing: {names:?}");
        }
    }
    for f in &files {
        match f.extension().and_then(|e| e.to_str()) {
            Some("png") => {
                let (w, h) = check_png(f);
                assert!(w >= 400 && h >= 300, "{}: {w}×{h}", f.display());
            }
            Some("svg") => {
                assert!(!svg_texts(f).is_empty(), "{}: no text", f.display());
            }
            Some("dot") => {}
            other => panic!("unexpected file {other:?}"),
        }
    }
    // The cell pictures name every op of their cell, and the inputs and output.
    let texts = svg_texts(&out.join("normal.svg"));
    for e in g.normal.iter().flatten() {
        assert!(texts.iter().any(|t| t == e.op.name()), "{} not drawn: {texts:?}", e.op);
    }
    for label in ["c_{k-2}", "c_{k-1}", "c_{k}", "0", "3"] {
        assert!(texts.iter().any(|t| t == label), "{label} not drawn");
    }
    let alpha = svg_texts(&out.join("alphas-normal.svg"));
    // Named as the cell pictures name them (pt.darts' visualize.py): edge 13 is the last input
    // of the fourth intermediate node, the third one's output; edge 9 its first, c_{k-2}.
    assert!(alpha.iter().any(|t| t == "edge 13: node 3 ← 2"), "{alpha:?}");
    assert!(alpha.iter().any(|t| t == "edge 9: node 3 ← c_{k-2}"), "{alpha:?}");
    assert!(alpha.iter().any(|t| t == "edge 1: node 0 ← c_{k-1}"), "{alpha:?}");
    assert!(svg_texts(&out.join("quant-error.svg")).iter().any(|t| t.contains("1 exact")));
}

#[test]
fn edges_are_numbered_node_by_node() {
    assert_eq!(edge_ends(5), [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]);
    assert_eq!(edge_ends(14).last(), Some(&(5, 4)));
}

#[test]
fn the_dot_text_has_every_edge_and_graphviz_renders_it_when_installed() {
    let g = known("DARTS_V2").expect("DARTS_V2");
    let cell = Cell { name: "reduce", nodes: &g.reduce, concat: &g.reduce_concat, bits: None };
    let dot = to_dot(&cell);
    let edges = dot.lines().filter(|l| l.contains("->") && l.contains("label=")).count();
    assert_eq!(edges, 8);
    assert!(dot.contains("\"c_{k-1}\" -> \"0\" [label=\"max_pool_3x3\""), "{dot}");
    assert_eq!(dot.lines().filter(|l| l.contains("-> \"c_{k}\"")).count(), 4);
    if !dot_available() {
        qdarts_record::scratch::tool_missing("graphviz (dot) is not installed");
        return;
    }
    let d = scratch("dot");
    let files = draw_cell(&cell, &d.join("reduce"), Renderer::Dot).expect("dot");
    assert_eq!(files.len(), 3);
    check_png(&d.join("reduce.png"));
    let texts = svg_texts(&d.join("reduce.svg"));
    assert!(texts.iter().any(|t| t == "max_pool_3x3"), "{texts:?}");
}

#[test]
fn a_comparison_draws_top1_by_group_and_curves() {
    let d = scratch("across");
    let mut runs = Vec::new();
    for (i, shift) in [0.0, 0.02, -0.1].iter().enumerate() {
        let dir = d.join(format!("r{i}"));
        fake_run(&dir, i as u64, *shift);
        runs.push(read_run(&dir).expect("run read"));
    }
    let c = Comparison::new(runs);
    let files = plot_comparison(&c, &d.join("plots")).expect("plotted");
    assert_eq!(files.len(), 4);
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "png")) {
        check_png(f);
    }
    let texts = svg_texts(&d.join("plots").join("compare-top1.svg"));
    assert!(texts.iter().any(|t| t.starts_with("G1")), "{texts:?}");
}

#[test]
fn a_folder_without_a_run_is_an_error() {
    let d = scratch("empty");
    let err = plot_run(&d, &d.join("plots"), Renderer::Builtin).expect_err("no run").to_string();
    assert!(err.contains("not a run folder"), "{err}");
}

#[test]
fn with_bits_each_edge_is_labelled_with_its_op_and_bits() {
    use qdarts_genotypes::Bits;
    let g = known("DARTS_V2").expect("DARTS_V2");
    let bits: Vec<Vec<Bits>> = g
        .normal
        .iter()
        .enumerate()
        .map(|(i, n)| n.iter().map(|_| Bits { weight: 2 + i as u8, act: 8 }).collect())
        .collect();
    let cell =
        Cell { name: "normal", nodes: &g.normal, concat: &g.normal_concat, bits: Some(&bits) };
    let dot = to_dot(&cell);
    assert!(dot.contains("[label=\"sep_conv_3x3 w2a8\""), "{dot}");
    assert!(dot.contains("w5a8"), "{dot}");
    let d = scratch("bits");
    draw_cell(&cell, &d.join("normal"), Renderer::Builtin).expect("drawn");
    let texts = svg_texts(&d.join("normal.svg"));
    assert!(texts.iter().any(|t| t == "sep_conv_3x3 w2a8"), "{texts:?}");
}
