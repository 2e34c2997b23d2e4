//! The run record's formats against their documented text: headers, number formats, quoting,
//! the lock, appending with a torn last line, and the cut back to a checkpoint.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

use qdarts_record::{
    AlphaRow, CellType, GenotypeRow, MetricsRow, NanAction, NanEventRow, NanSite, Phase, Plan,
    QuantError, QuantErrorRow, RecordError, RunDir, RunLayout, Table, TensorRole, encode_row,
    header_line, parse_line, read_plan, read_table, split_line, truncate_to, write_plan,
};

fn scratch(name: &str) -> PathBuf {
    qdarts_record::scratch::scratch(&format!("record-{name}"))
}

fn line<T: Table>(row: &T) -> String {
    String::from_utf8(encode_row(row).unwrap()).unwrap()
}

/// The header a serde CSV writer derives from the row's field names.
fn serde_header<T: Table>(row: &T) -> String {
    let mut w =
        csv::WriterBuilder::new().terminator(csv::Terminator::Any(b'\n')).from_writer(Vec::new());
    w.serialize(row).unwrap();
    let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
    text.lines().next().unwrap().to_string() + "\n"
}

fn metrics() -> MetricsRow {
    MetricsRow {
        epoch: 0,
        step: 7,
        phase: Phase::Train,
        loss: 2.301_585_1,
        top1: 0.093_75,
        lr: 0.025,
        arch_lr: 0.01,
        seconds: 12.345_67,
    }
}

#[test]
fn every_table_has_its_documented_header_and_it_matches_the_row_fields() {
    let nan = NanEventRow {
        epoch: 1,
        step: 9,
        site: NanSite::Grad,
        layer: "cells.0.edges.1".into(),
        value: f64::NAN,
        action: NanAction::Skipped,
    };
    let quant = QuantErrorRow {
        epoch: 0,
        step: 20,
        error: QuantError {
            layer: "stem.conv.weight".into(),
            kind: TensorRole::Weight,
            bits: 8,
            scale: 0.001_953_125,
            zero_point: 0.0,
            mse: 1.5e-7,
            sqnr_db: 41.23456,
            clip_frac: 0.0,
        },
    };
    let alpha = AlphaRow {
        epoch: 2,
        cell_type: CellType::Reduce,
        edge: 3,
        op: "sep_conv_3x3".into(),
        weight: 0.125,
    };
    let genotype = GenotypeRow { epoch: 0, genotype: "Genotype(normal=[])".into() };
    // The headers of DESIGN.md's run-record table.
    assert_eq!(header_line::<MetricsRow>(), "epoch,step,phase,loss,top1,lr,arch_lr,seconds\n");
    assert_eq!(header_line::<NanEventRow>(), "epoch,step,site,layer,value,action\n");
    assert_eq!(
        header_line::<QuantErrorRow>(),
        "epoch,step,layer,kind,bits,scale,zero_point,mse,sqnr_db,clip_frac\n"
    );
    assert_eq!(header_line::<AlphaRow>(), "epoch,cell_type,edge,op,weight\n");
    assert_eq!(header_line::<GenotypeRow>(), "epoch,genotype\n");
    assert_eq!(serde_header(&metrics()), header_line::<MetricsRow>());
    assert_eq!(serde_header(&nan), header_line::<NanEventRow>());
    assert_eq!(serde_header(&quant), header_line::<QuantErrorRow>());
    assert_eq!(serde_header(&alpha), header_line::<AlphaRow>());
    assert_eq!(serde_header(&genotype), header_line::<GenotypeRow>());
}

#[test]
fn rows_are_written_in_their_fixed_number_formats() {
    assert_eq!(line(&metrics()), "0,7,train,2.301585,0.093750,0.025000,0.010000,12.346\n");
    // A run without an architecture step writes its arch_lr as a bare 0.
    let train = MetricsRow { phase: Phase::Val, arch_lr: 0.0, ..metrics() };
    assert_eq!(line(&train), "0,7,val,2.301585,0.093750,0.025000,0,12.346\n");
    let nan = |site, value, action| NanEventRow {
        epoch: 1,
        step: 9,
        site,
        layer: "-".into(),
        value,
        action,
    };
    assert_eq!(line(&nan(NanSite::Loss, f64::NAN, NanAction::Skipped)), "1,9,loss,-,NaN,skipped\n");
    assert_eq!(line(&nan(NanSite::Lr, 0.0125, NanAction::LrHalved)), "1,9,lr,-,0.0125,lr_halved\n");
    assert_eq!(line(&nan(NanSite::Guard, 11.0, NanAction::Aborted)), "1,9,guard,-,11,aborted\n");
    assert_eq!(
        line(&nan(NanSite::Grad, f64::INFINITY, NanAction::RolledBack)),
        "1,9,grad,-,inf,rolled_back\n"
    );
    let q = QuantErrorRow {
        epoch: 0,
        step: 20,
        error: QuantError {
            layer: "stem.conv.weight".into(),
            kind: TensorRole::Weight,
            bits: 8,
            scale: 0.001_953_125,
            zero_point: -3.5,
            mse: 1.5e-7,
            sqnr_db: 41.23456,
            clip_frac: 0.25,
        },
    };
    assert_eq!(
        line(&q),
        "0,20,stem.conv.weight,weight,8,1.953125e-3,-3.5,1.5e-7,41.235,0.250000\n"
    );
    let a = AlphaRow {
        epoch: 2,
        cell_type: CellType::Normal,
        edge: 3,
        op: "max_pool_3x3".into(),
        weight: 0.1,
    };
    assert_eq!(line(&a), "2,normal,3,max_pool_3x3,0.100000\n");
}

#[test]
fn text_with_commas_and_quotes_is_quoted_as_rfc_4180_says() {
    let g = GenotypeRow {
        epoch: 4,
        genotype: "Genotype(normal=[[('skip_connect', 0)]], normal_concat=range(2, 3))".into(),
    };
    let text = line(&g);
    assert_eq!(text, "4,\"Genotype(normal=[[('skip_connect', 0)]], normal_concat=range(2, 3))\"\n");
    let header = split_line("epoch,genotype").unwrap();
    assert_eq!(parse_line::<GenotypeRow>(&header, text.trim_end()), Some(g));
    let odd = GenotypeRow { epoch: 1, genotype: "say \"hi\", twice".into() };
    assert_eq!(line(&odd), "1,\"say \"\"hi\"\", twice\"\n");
    assert_eq!(parse_line::<GenotypeRow>(&header, line(&odd).trim_end()), Some(odd));
}

#[test]
fn lines_are_read_by_column_name_and_malformed_ones_are_refused() {
    // Columns reordered and one added: still read by name.
    let header = split_line("step,epoch,extra,genotype").unwrap();
    let row: GenotypeRow = parse_line(&header, "5,2,x,G").unwrap();
    assert_eq!(row, GenotypeRow { epoch: 2, genotype: "G".into() });
    let header = split_line(header_line::<MetricsRow>().trim_end()).unwrap();
    assert!(parse_line::<MetricsRow>(&header, "0,1,train,2.3,0.1,0.025,0.01").is_none());
    assert!(parse_line::<MetricsRow>(&header, "0,1,walk,2.3,0.1,0.025,0.01,1.0").is_none());
    assert!(parse_line::<MetricsRow>(&header, "x,1,train,2.3,0.1,0.025,0.01,1.0").is_none());
    // A quote left open: the row was cut inside a quoted field.
    assert!(split_line("1,\"open").is_none());
    assert_eq!(split_line("1,\"a,b\",c").unwrap().iter().collect::<Vec<_>>(), ["1", "a,b", "c"]);
}

#[test]
fn a_second_writer_is_refused_while_the_first_holds_the_lock() {
    let parent = scratch("lock");
    let run = RunDir::create(&parent, "t").unwrap();
    // Another holder (another open file: flock conflicts between them, also in one process).
    let err = RunDir::open(run.root()).unwrap_err();
    let me = std::process::id();
    assert!(matches!(err, RecordError::Locked { pid, .. } if pid == me), "{err}");
    assert!(err.to_string().contains(&format!("process {me}")), "{err}");
    assert_eq!(qdarts_record::lock_owner(&RunLayout::new(run.root())), Some(me));
    let root = run.root().to_path_buf();
    drop(run);
    // Released: the file stays, empty, and the next writer takes it.
    assert_eq!(fs::read_to_string(RunLayout::new(&root).lock()).unwrap(), "");
    let again = RunDir::open(&root).unwrap();
    // A pid left in the file by a killed process means nothing: the OS released its lock.
    drop(again);
    fs::write(RunLayout::new(&root).lock(), "4000000000\n").unwrap();
    assert!(RunDir::open(&root).is_ok());
}

#[test]
fn tables_append_whole_rows_and_a_torn_last_line_is_cut() {
    let parent = scratch("append");
    let run = RunDir::create(&parent, "t").unwrap();
    {
        let mut w = run.writer::<GenotypeRow>().unwrap();
        w.push(&GenotypeRow { epoch: 0, genotype: "a".into() }).unwrap();
    }
    // A killed writer left half a row.
    let path = run.table::<GenotypeRow>();
    OpenOptions::new().append(true).open(&path).unwrap().write_all(b"1,hal").unwrap();
    assert_eq!(read_table::<GenotypeRow>(&path).unwrap().len(), 1);
    let mut w = run.writer::<GenotypeRow>().unwrap();
    w.push(&GenotypeRow { epoch: 1, genotype: "b".into() }).unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), "epoch,genotype\n0,a\n1,b\n");
    let rows = read_table::<GenotypeRow>(&path).unwrap();
    assert_eq!(rows[1], GenotypeRow { epoch: 1, genotype: "b".into() });
    // Epoch 1 is cut: the checkpoint is at the start of epoch 1.
    run.truncate::<GenotypeRow>(1, 99).unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), "epoch,genotype\n0,a\n");
}

#[test]
fn a_resume_keeps_the_rows_up_to_the_checkpoint_step() {
    let d = scratch("truncate");
    let q = d.join("s.csv");
    fs::write(&q, "epoch,step,v\n0,1,a\n0,2,b\n1,3,c\n1,4,d\n1,5,e\n2,6,f\n").unwrap();
    truncate_to(&q, 1, Some(4)).unwrap();
    assert_eq!(fs::read_to_string(&q).unwrap(), "epoch,step,v\n0,1,a\n0,2,b\n1,3,c\n1,4,d\n");
    truncate_to(&q, 1, None).unwrap();
    assert_eq!(fs::read_to_string(&q).unwrap(), "epoch,step,v\n0,1,a\n0,2,b\n");
    // A table never written stays absent.
    truncate_to(&d.join("none.csv"), 0, None).unwrap();
    assert!(!d.join("none.csv").exists());
}

#[test]
fn a_bad_row_in_a_whole_table_read_names_the_file_and_line() {
    let d = scratch("bad");
    let p = d.join("metrics.csv");
    fs::write(
        &p,
        format!("{}0,1,train,1,1,1,0,1\n0,2,train,oops,1,1,0,1\n", header_line::<MetricsRow>()),
    )
    .unwrap();
    let err = read_table::<MetricsRow>(&p).unwrap_err().to_string();
    assert!(err.contains("metrics.csv") && err.contains("line 3"), "{err}");
}

#[test]
fn the_plan_is_json_in_field_name_order() {
    let d = scratch("plan");
    let run = RunLayout::new(&d);
    let plan =
        Plan { batch_size: 32, epochs: 6, steps_per_epoch: 10, train_images: 320, val_images: 320 };
    write_plan(&run, &plan).unwrap();
    assert_eq!(
        fs::read_to_string(run.plan()).unwrap(),
        r#"{"batch_size":32,"epochs":6,"steps_per_epoch":10,"train_images":320,"val_images":320}"#
    );
    assert_eq!(read_plan(&run), Some(plan));
}
