//! Genotypes: the published ones, round trips through JSON and DARTS text, both text dialects,
//! parse errors with positions, and derivation from architecture weights.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use qdarts_genotypes::{Edge, Genotype, GenotypeError, KNOWN, Primitive, edge_count, known};

fn e(op: &str, input: usize) -> Edge {
    Edge { op: op.parse().unwrap(), input }
}

#[test]
fn darts_v2_reads_as_published() {
    // quark0/darts cnn/genotypes.py, DARTS_V2: flat pairs, two per node.
    let g = known("DARTS_V2").unwrap();
    assert_eq!(g.normal.len(), 4);
    assert_eq!(g.normal[0], vec![e("sep_conv_3x3", 0), e("sep_conv_3x3", 1)]);
    assert_eq!(g.normal[2], vec![e("sep_conv_3x3", 1), e("skip_connect", 0)]);
    assert_eq!(g.normal[3], vec![e("skip_connect", 0), e("dil_conv_3x3", 2)]);
    assert_eq!(g.reduce[1], vec![e("skip_connect", 2), e("max_pool_3x3", 1)]);
    assert_eq!(g.normal_concat, vec![2, 3, 4, 5]);
    assert_eq!(known("DARTS").unwrap(), g);
}

#[test]
fn every_shipped_genotype_parses_validates_and_round_trips() {
    for (name, _) in KNOWN {
        let g = known(name).unwrap();
        let text = g.to_darts_text();
        assert_eq!(Genotype::from_darts_text(&text).unwrap(), g, "{name} through text");
        let json = g.to_json();
        assert_eq!(
            Genotype::from_json(std::str::from_utf8(&json).unwrap()).unwrap(),
            g,
            "{name} through JSON"
        );
    }
    // NASNet: five nodes, a concat that skips states; AmoebaNet reads state 5.
    let nas = known("NASNet").unwrap();
    assert_eq!((nas.normal.len(), nas.reduce_concat.clone()), (5, vec![4, 5, 6]));
    assert_eq!(known("AmoebaNet").unwrap().reduce[4][1], e("sep_conv_3x3", 5));
}

#[test]
fn the_pt_darts_form_is_written_exactly() {
    let g = known("PT_DARTS_CIFAR10").unwrap();
    assert_eq!(
        g.to_darts_text(),
        "Genotype(normal=[[('sep_conv_3x3', 0), ('dil_conv_5x5', 1)], [('skip_connect', 0), \
         ('dil_conv_3x3', 2)], [('sep_conv_3x3', 1), ('skip_connect', 0)], [('sep_conv_3x3', 1), \
         ('skip_connect', 0)]], normal_concat=range(2, 6), reduce=[[('max_pool_3x3', 0), \
         ('max_pool_3x3', 1)], [('max_pool_3x3', 0), ('skip_connect', 2)], [('skip_connect', 3), \
         ('max_pool_3x3', 0)], [('skip_connect', 2), ('max_pool_3x3', 0)]], reduce_concat=range(2, 6))"
    );
    // A concat that is not a range is written as a list; a contiguous one as a range.
    let amoeba = known("AmoebaNet").unwrap().to_darts_text();
    assert!(amoeba.contains("normal_concat=range(4, 7)"), "{amoeba}");
    assert!(amoeba.contains("reduce_concat=[3, 4, 6]"), "{amoeba}");
}

#[test]
fn flat_and_nested_dialects_read_the_same_genotype() {
    let flat = "DARTS_V2 = Genotype(normal=[('sep_conv_3x3', 0), ('sep_conv_3x3', 1), \
                ('sep_conv_3x3', 0), ('sep_conv_3x3', 1)], normal_concat=[2, 3], \
                reduce=[(\"max_pool_3x3\", 0), ('max_pool_3x3', 1), ('skip_connect', 2), \
                ('max_pool_3x3', 1)], reduce_concat=range(2, 4))";
    let nested = "Genotype(\n  [[('sep_conv_3x3', 0), ('sep_conv_3x3', 1)], # node 2\n   \
                  [('sep_conv_3x3', 0), ('sep_conv_3x3', 1)]],\n  range(2, 4),\n  \
                  [[('max_pool_3x3', 0), ('max_pool_3x3', 1)], [('skip_connect', 2), \
                  ('max_pool_3x3', 1)],],\n  [2, 3],\n)";
    assert_eq!(
        Genotype::from_darts_text(flat).unwrap(),
        Genotype::from_darts_text(nested).unwrap()
    );
}

fn syntax(text: &str) -> (usize, usize, String) {
    match Genotype::from_darts_text(text).unwrap_err() {
        GenotypeError::Syntax { line, column, message } => (line, column, message),
        other => panic!("expected a syntax error, got {other}"),
    }
}

#[test]
fn parse_errors_name_the_line_and_column() {
    let (l, c, m) = syntax(
        "Genotype(normal=[[('sep_conv_3x3', 0)]],\n  normal_concat=range(2, 3),\n  reduce=[[('sep_conv_9x9', 0)]], reduce_concat=[2])",
    );
    assert_eq!((l, c), (3, 13), "{m}");
    assert!(m.contains("sep_conv_9x9"), "{m}");

    let (l, c, m) = syntax("Genotype(normal=[[('sep_conv_3x3', 0) ('skip_connect', 1)]])");
    assert_eq!((l, c), (1, 39), "{m}");
    assert!(m.contains("expected `,`"), "{m}");

    let (_, _, m) = syntax("Genotype(normal=[[('sep_conv_3x3, 0)]])");
    assert!(m.contains("unterminated"), "{m}");
    let (_, _, m) = syntax(
        "Genotype(normal=[('sep_conv_3x3', 0)], normal_concat=[2], reduce=[('skip_connect', 0)], reduce_concat=[2])",
    );
    assert!(m.contains("two per node"), "{m}");
    let (_, _, m) = syntax(
        "Genotype(normal=[[('sep_conv_3x3', 0)]], normal_concat=[2], reduce=[[('skip_connect', 0)]])",
    );
    assert!(m.contains("missing field `reduce_concat`"), "{m}");
    // Not Python: nothing but the genotype literal is accepted.
    let (_, _, m) = syntax("eval('Genotype()')");
    assert!(m.contains("expected `Genotype(`, found `eval`"), "{m}");
    let (l, c, m) = syntax("__import__('os').system('true')");
    assert_eq!((l, c), (1, 17), "{m}");
    let (_, _, m) = syntax(
        "Genotype(normal=[[('sep_conv_3x3', 0)]], normal_concat=[2], reduce=[[('skip_connect', 0)]], reduce_concat=[2], extra=[1])",
    );
    assert!(m.contains("unknown field `extra`"), "{m}");
}

#[test]
fn genotypes_that_read_future_states_are_rejected() {
    let err = Genotype::from_darts_text(
        "Genotype(normal=[[('sep_conv_3x3', 2)]], normal_concat=[2], reduce=[[('skip_connect', 0)]], reduce_concat=[2])",
    )
    .unwrap_err();
    assert!(err.to_string().contains("node 2 reads state 2"), "{err}");
    let err = Genotype::from_json(r#"{"normal": [[["sep_conv_3x3", 0]]], "normal_concat": [2, 3], "reduce": [[["skip_connect", 1]]], "reduce_concat": [2]}"#).unwrap_err();
    assert!(err.to_string().contains("names state 3"), "{err}");
    let err = Genotype::from_json(r#"{"normal": [[["conv_9x9", 0]]]}"#).unwrap_err();
    assert!(err.to_string().contains("conv_9x9"), "{err}");
}

/// α that make `g`'s edges the strongest, in the order they are listed.
fn alphas_for(nodes: &[Vec<Edge>], prims: &[Primitive]) -> Vec<Vec<f32>> {
    let mut alpha = vec![vec![0.0f32; prims.len()]; edge_count(nodes.len())];
    let mut start = 0;
    for (i, edges) in nodes.iter().enumerate() {
        for (rank, edge) in edges.iter().enumerate() {
            let op = prims.iter().position(|p| *p == edge.op).unwrap();
            alpha[start + edge.input][op] = 5.0 - rank as f32;
        }
        start += i + 2;
    }
    alpha
}

#[test]
fn deriving_from_alphas_that_encode_a_genotype_gives_it_back() {
    for name in ["DARTS_V2", "PT_DARTS_CIFAR10", "PT_DARTS_MNIST"] {
        let g = known(name).unwrap();
        let p = Primitive::DARTS;
        let d = Genotype::derive(&alphas_for(&g.normal, &p), &alphas_for(&g.reduce, &p), &p, 4, 2)
            .unwrap();
        assert_eq!(d, g, "{name}");
    }
}

#[test]
fn edges_are_ranked_after_the_softmax_not_on_raw_alphas() {
    // Node 2 has two inputs; node 3 three. On input 0 of node 3 `none` dominates, so its best
    // real op has weight softmax([5, 4, 0, ..])[1] ≈ 0.27; input 1's best has ≈ 0.97 though its
    // raw α (3.5) is lower than input 0's (4). DARTS keeps inputs 1 and 2; ranking raw α, as
    // pt.darts does, would keep input 0.
    let p = Primitive::DARTS; // none, max_pool, avg_pool, skip, sep3, sep5, dil3, dil5
    let mut alpha = vec![vec![0.0f32; 8]; edge_count(2)];
    alpha[0][4] = 1.0;
    alpha[1][5] = 1.0;
    alpha[2] = vec![5.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0];
    alpha[3] = vec![-10.0, -10.0, -10.0, -10.0, -10.0, -10.0, 3.5, -10.0];
    alpha[4] = vec![0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0];
    let nodes = qdarts_genotypes::derive_cell(&alpha, &p, 2, 2).unwrap();
    assert_eq!(nodes[1], vec![e("dil_conv_3x3", 1), e("skip_connect", 2)]);
}

#[test]
fn ties_keep_the_lower_index_and_bad_shapes_are_errors() {
    let p = Primitive::DARTS;
    let alpha = vec![vec![0.0f32; 8]; edge_count(1)];
    let nodes = qdarts_genotypes::derive_cell(&alpha, &p, 1, 2).unwrap();
    // All equal: the first non-`none` op on inputs 0 then 1.
    assert_eq!(nodes[0], vec![e("max_pool_3x3", 0), e("max_pool_3x3", 1)]);
    let err = qdarts_genotypes::derive_cell(&alpha, &p, 2, 2).unwrap_err();
    assert!(err.to_string().contains("2 edges given"), "{err}");
    let mut nan = alpha.clone();
    nan[0][3] = f32::NAN;
    assert!(qdarts_genotypes::derive_cell(&nan, &p, 1, 2).is_err());
}
