//! Each dashboard panel on its own, drawn from a state built from hand-written run-record rows
//! (no search runs first): what a normal terminal shows, and no panic on small and 1×1 ones.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use qdarts_record::{
    AlphaRow, GenotypeRow, MetricsRow, NanEventRow, QuantErrorRow, Table, header_line, split_line,
};
use qdarts_tui::panels::{
    AlphaPanel, Curve, Curves, GenotypePanel, Header, NanTable, QuantSort, QuantTable,
};
use qdarts_tui::state::{CellType, DashboardState, Plan, Source};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::widgets::Widget;

const GENOTYPE: &str = "Genotype(normal=[[('sep_conv_3x3', 0), ('skip_connect', 1)], \
[('max_pool_3x3', 0), ('dil_conv_5x5', 2)]], normal_concat=range(2, 4), \
reduce=[[('avg_pool_3x3', 0), ('max_pool_3x3', 1)], [('sep_conv_5x5', 1), ('skip_connect', 2)]], \
reduce_concat=range(2, 4))";

fn feed<T: Table>(state: &mut DashboardState, source: Source, lines: &[&str]) {
    let header = split_line(header_line::<T>().trim_end()).unwrap();
    for line in lines {
        state.apply(source, &header, line);
    }
}

/// Two epochs of a 2-node search with 3 ops: the kind of state a live run builds.
fn state() -> DashboardState {
    let mut s = DashboardState::new("default-20261122-000000");
    s.plan = Some(Plan { epochs: 2, steps_per_epoch: 3 });
    feed::<MetricsRow>(
        &mut s,
        Source::Metrics,
        &[
            "0,1,train,2.302585,0.093750,0.025000,0.010000,1.000",
            "0,2,train,2.201000,0.156250,0.025000,0.010000,2.000",
            "0,3,train,2.100000,0.187500,0.025000,0.010000,3.000",
            "0,3,val,2.050000,0.250000,0.025000,0.010000,3.500",
            "1,4,train,1.900000,0.312500,0.012500,0.010000,4.500",
        ],
    );
    feed::<NanEventRow>(
        &mut s,
        Source::Nan,
        &["1,4,grad,cells.0.edges.1.sep_conv_3x3,NaN,skipped"],
    );
    feed::<QuantErrorRow>(
        &mut s,
        Source::Quant,
        &[
            "0,3,stem.conv.weight,weight,8,1.953125e-3,0,1.5e-7,41.235,0.000000",
            "0,3,cells.0.edges.1.sep_conv_3x3.op1.act,act,8,2.5e-2,0,3e-3,12.500,0.012000",
        ],
    );
    let mut alphas = Vec::new();
    for cell in ["normal", "reduce"] {
        for edge in 0..5 {
            for (k, op) in ["none", "max_pool_3x3", "sep_conv_3x3"].iter().enumerate() {
                let w = if k == 2 { 0.5 } else { 0.25 };
                alphas.push(format!("0,{cell},{edge},{op},{w:.6}"));
            }
        }
    }
    let alpha_lines: Vec<&str> = alphas.iter().map(String::as_str).collect();
    feed::<AlphaRow>(&mut s, Source::Alphas, &alpha_lines);
    let g = format!("0,\"{GENOTYPE}\"");
    feed::<GenotypeRow>(&mut s, Source::Genotypes, &[g.as_str()]);
    s
}

fn draw(widget: impl Widget, w: u16, h: u16) -> String {
    let area = Rect::new(0, 0, w, h);
    let mut buf = Buffer::empty(area);
    widget.render(area, &mut buf);
    let mut out = String::new();
    for y in 0..h {
        for x in 0..w {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

/// Draws at a normal size and returns the screen, after drawing at small sizes too.
fn screens(widget: impl Fn() -> Box<dyn Fn(Rect, &mut Buffer)>) -> String {
    for (w, h) in [(1, 1), (2, 2), (7, 3), (20, 5), (40, 8)] {
        let area = Rect::new(0, 0, w, h);
        let mut buf = Buffer::empty(area);
        widget()(area, &mut buf);
    }
    let area = Rect::new(0, 0, 120, 30);
    let mut buf = Buffer::empty(area);
    widget()(area, &mut buf);
    draw_buffer(&buf)
}

fn draw_buffer(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::new();
    for y in 0..area.height {
        for x in 0..area.width {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

#[test]
fn the_state_holds_the_rows_it_was_fed() {
    let s = state();
    assert_eq!((s.train.len(), s.val.len(), s.nan.len(), s.skipped_rows), (4, 1, 1, 0));
    assert_eq!(s.quant.len(), 2);
    assert_eq!(s.worst_quant().unwrap().error.layer, "cells.0.edges.1.sep_conv_3x3.op1.act");
    assert_eq!(s.alphas[0].normal.len(), 5);
    assert_eq!(s.current_genotype(), Some(GENOTYPE));
    assert_eq!(s.total_steps(), Some(6));
}

#[test]
fn the_header_shows_the_run_progress_and_nan_count() {
    let s = state();
    let screen = screens(|| {
        let s = s.clone();
        Box::new(move |a, b| (&Header { state: &s, search: None }).render(a, b))
    });
    assert!(screen.contains("default-20261122-000000"), "{screen}");
    assert!(screen.contains("NaN"), "{screen}");
    let short = draw(&Header { state: &s, search: Some(("running", false)) }, 1, 1);
    assert_eq!(short.trim_end().chars().count(), 1);
}

#[test]
fn the_curves_draw_train_and_validation_points() {
    let s = state();
    let c = Curves { state: &s, curve: Curve::Loss };
    let (train, val) = c.points();
    assert_eq!((train.len(), val.len()), (4, 1));
    let screen = screens(|| {
        let s = s.clone();
        Box::new(move |a, b| (&Curves { state: &s, curve: Curve::Top1 }).render(a, b))
    });
    assert!(screen.contains("top-1") || screen.contains("top1"), "{screen}");
}

#[test]
fn the_quant_table_lists_the_worst_layer_first_and_flags_it() {
    let s = state();
    let table = QuantTable {
        state: &s,
        sort: QuantSort::Sqnr,
        reversed: false,
        offset: 0,
        threshold: 20.0,
        compact: false,
    };
    assert_eq!(table.rows()[0].error.sqnr_db, 12.5);
    let screen = screens(|| {
        let s = s.clone();
        Box::new(move |a, b| {
            let t = QuantTable {
                state: &s,
                sort: QuantSort::Sqnr,
                reversed: false,
                offset: 0,
                threshold: 20.0,
                compact: false,
            };
            (&t).render(a, b)
        })
    });
    assert!(screen.contains("12.5") && screen.contains("41.2"), "{screen}");
}

#[test]
fn the_alpha_heat_map_shows_every_edge_of_the_chosen_cell() {
    let s = state();
    for cell in [CellType::Normal, CellType::Reduce] {
        let screen = screens(|| {
            let s = s.clone();
            Box::new(move |a, b| (&AlphaPanel { state: &s, cell }).render(a, b))
        });
        let name = if cell == CellType::Normal { "normal" } else { "reduce" };
        assert!(screen.contains(name), "{screen}");
        assert!(screen.contains("0.50"), "{screen}");
    }
}

#[test]
fn the_genotype_panel_lists_nodes_and_their_ops() {
    let s = state();
    let screen = screens(|| {
        let s = s.clone();
        Box::new(move |a, b| (&GenotypePanel { state: &s, offset: 0, compact: false }).render(a, b))
    });
    assert!(screen.contains("sep_conv_3x3") && screen.contains("dil_conv_5x5"), "{screen}");
}

#[test]
fn the_nan_table_shows_site_layer_value_and_action() {
    let s = state();
    let screen = screens(|| {
        let s = s.clone();
        Box::new(move |a, b| (&NanTable { state: &s, offset: 0 }).render(a, b))
    });
    for text in ["NaN events: 1", "grad", "NaN", "skipped"] {
        assert!(screen.contains(text), "{text}: {screen}");
    }
    let empty = DashboardState::new("empty");
    let none = draw(&NanTable { state: &empty, offset: 0 }, 60, 5);
    assert!(none.contains("no non-finite values"), "{none}");
}

#[test]
fn a_parameter_free_normal_cell_raises_the_collapse_alert_in_the_genotype_panel_and_header() {
    let pooled = "Genotype(normal=[[('max_pool_3x3', 0), ('avg_pool_3x3', 1)], \
                  [('avg_pool_3x3', 0), ('skip_connect', 2)]], normal_concat=range(2, 4), \
                  reduce=[[('sep_conv_3x3', 0), ('sep_conv_3x3', 1)], \
                  [('sep_conv_3x3', 0), ('sep_conv_3x3', 2)]], reduce_concat=range(2, 4))";
    let mut s = state();
    assert!(s.collapse_alert().is_none());
    feed::<qdarts_record::GenotypeRow>(&mut s, Source::Genotypes, &[&format!("5,\"{pooled}\"")]);
    let alert = s.collapse_alert().expect("alert");
    assert!(alert.contains("4 of the normal cell's 4 edges"), "{alert}");
    let screen = draw(&GenotypePanel { state: &s, offset: 0, compact: true }, 120, 12);
    assert!(screen.contains("collapse: 4 of the normal cell's 4 edges"), "{screen}");
    let header = draw(&Header { state: &s, search: None }, 200, 3);
    assert!(header.contains("collapse: normal cell mostly parameter-free"), "{header}");
}

#[test]
fn a_bit_search_shows_each_kept_ops_widths_and_the_expected_cost_over_time() {
    let mut s = state();
    // Epoch 1's widths of sep_conv_3x3 on normal edge 0 (node 2 reads 0) and of dil_conv_5x5 on
    // normal edge 4 (node 3 reads node 2); epoch 0's rows are superseded.
    feed::<qdarts_record::BitRow>(
        &mut s,
        Source::Bits,
        &[
            "0,normal,0,sep_conv_3x3,weight,2,0.100000",
            "0,normal,0,sep_conv_3x3,weight,8,0.900000",
            "1,normal,0,sep_conv_3x3,weight,2,0.200000",
            "1,normal,0,sep_conv_3x3,weight,4,0.700000",
            "1,normal,0,sep_conv_3x3,weight,8,0.100000",
            "1,normal,0,sep_conv_3x3,act,4,0.300000",
            "1,normal,0,sep_conv_3x3,act,8,0.700000",
            "1,normal,4,dil_conv_5x5,weight,2,0.600000",
            "1,normal,4,dil_conv_5x5,weight,8,0.400000",
            "1,normal,4,dil_conv_5x5,act,4,0.550000",
            "1,normal,4,dil_conv_5x5,act,8,0.450000",
        ],
    );
    feed::<qdarts_record::CostRow>(
        &mut s,
        Source::Cost,
        &["0,5.1e7,6242.058,0.250000", "1,4.6e7,5800.500,0.150000"],
    );
    assert_eq!(s.op_widths(CellType::Normal, 0, "sep_conv_3x3"), Some((4, 8)));
    assert_eq!(s.op_widths(CellType::Normal, 4, "dil_conv_5x5"), Some((2, 4)));
    assert_eq!(s.op_widths(CellType::Normal, 1, "skip_connect"), None);
    let screen = draw(&GenotypePanel { state: &s, offset: 0, compact: true }, 120, 12);
    assert!(screen.contains("sep_conv_3x3 w4a8 ← 0"), "{screen}");
    assert!(screen.contains("dil_conv_5x5 w2a4 ← 2"), "{screen}");
    assert!(screen.contains("skip_connect ← 1"), "{screen}");
    let header = draw(&Header { state: &s, search: None }, 220, 3);
    assert!(header.contains("E[BitOPs] 5.100e7 → 4.600e7"), "{header}");
    assert!(header.contains("E[weights] 5800 B"), "{header}");
}

#[test]
fn the_header_shows_the_selection_phase_and_its_last_verdict() {
    let mut s = state();
    feed::<qdarts_record::SelectionRow>(
        &mut s,
        Source::Selection,
        &[
            "1,normal,op,0,0,max_pool_3x3,0.815625,0.571644,0.006250,-",
            "1,normal,op,0,0,sep_conv_3x3,0.784375,0.618881,0.037500,kept",
            "1,reduce,op,1,3,skip_connect,0.700000,0.900000,0.120000,kept",
            "2,normal,input,1,4,avg_pool_3x3,0.790000,0.600000,-0.005000,removed",
        ],
    );
    let header = draw(&Header { state: &s, search: None }, 240, 3);
    assert!(header.contains("selection 2 ops kept, 1 inputs removed"), "{header}");
    assert!(
        header.contains("last: normal edge 4: taken off its node (top-1 +0.5 pts without it)"),
        "{header}"
    );
    // Before any decision the header has no selection part.
    let header = draw(&Header { state: &state(), search: None }, 240, 3);
    assert!(!header.contains("selection"), "{header}");
}

#[test]
fn the_alpha_and_genotype_panels_count_epochs_from_one_as_the_header_does() {
    // The record counts epochs from 0; the screen from 1 ("epoch 2/2" in the header while the
    // second epoch runs), so all three panels name the second epoch "epoch 2".
    let mut s = state();
    let alphas: Vec<String> = ["normal", "reduce"]
        .iter()
        .flat_map(|cell| {
            (0..5).flat_map(move |edge| {
                ["none", "max_pool_3x3", "sep_conv_3x3"]
                    .iter()
                    .map(move |op| format!("1,{cell},{edge},{op},0.333333"))
            })
        })
        .collect();
    let lines: Vec<&str> = alphas.iter().map(String::as_str).collect();
    feed::<AlphaRow>(&mut s, Source::Alphas, &lines);
    let changed = GENOTYPE.replacen("('sep_conv_3x3', 0)", "('dil_conv_3x3', 0)", 1);
    feed::<GenotypeRow>(&mut s, Source::Genotypes, &[&format!("1,\"{changed}\"")]);
    let header = draw(&Header { state: &s, search: None }, 200, 3);
    assert!(header.contains("epoch 2/2"), "{header}");
    let alpha = draw(&AlphaPanel { state: &s, cell: CellType::Normal }, 120, 30);
    assert!(alpha.contains("normal cell, epoch 2 "), "{alpha}");
    let genotype = draw(&GenotypePanel { state: &s, offset: 0, compact: false }, 120, 30);
    assert!(genotype.contains("genotype after epoch 2"), "{genotype}");
    assert!(genotype.contains("epoch 2: 1 node(s) changed"), "{genotype}");
    assert!(!genotype.contains("epoch 1:"), "{genotype}");
}
