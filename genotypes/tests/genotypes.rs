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
        let json = g.to_json().unwrap();
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

mod skip_limit {
    use qdarts_genotypes::{
        DeriveOptions, Edge, Genotype, Primitive, derive_cell, derive_cell_limited,
    };

    const OPS: [Primitive; 4] =
        [Primitive::None, Primitive::MaxPool3x3, Primitive::SkipConnect, Primitive::SepConv3x3];

    /// α rows of a 3-node cell (9 edges): `skip[e]` is edge e's skip_connect logit, sep_conv
    /// 1.0 and max_pool 0.5 everywhere, none −5.
    fn alpha(skip: [f32; 9]) -> Vec<Vec<f32>> {
        skip.iter().map(|&s| vec![-5.0, 0.5, s, 1.0]).collect()
    }

    fn e(op: Primitive, input: usize) -> Edge {
        Edge { op, input }
    }

    #[test]
    fn p_darts_takes_skip_off_the_weakest_edges_until_the_limit_holds() {
        use Primitive::{SepConv3x3 as S, SkipConnect as K};
        // Edges (node, input): 0:(2,0) 1:(2,1) 2:(3,0) 3:(3,1) 4:(3,2) 5:(4,0) 6:(4,1) 7:(4,2) 8:(4,3).
        let a = alpha([5.0, 4.0, 3.0, 6.0, 0.0, 2.5, 0.0, 0.0, 7.0]);
        let plain = derive_cell(&a, &OPS, 3, 2).expect("derived");
        // Unlimited: six skip edges.
        assert_eq!(plain, [vec![e(K, 0), e(K, 1)], vec![e(K, 1), e(K, 0)], vec![e(K, 3), e(K, 0)]]);
        // At most 2: the four weakest skips (logits 2.5, 3, 4, 5) go one by one. An edge that
        // lost its skip offers sep_conv at its softmax weight, which is smaller the stronger
        // its skip was, so in each node an edge whose skip was weak (logit 0) wins the place:
        // node 4 keeps skip(3) and takes sep(1) (edges 6 and 7 tie; the lower input wins),
        // node 3 keeps skip(1) and takes sep(2), node 2 loses both skips (sep(1) before
        // sep(0): edge 1's skip was the weaker). The two strongest skips (7, 6) stay.
        let limited = derive_cell_limited(&a, &OPS, 3, 2, 2).expect("limited");
        assert_eq!(
            limited,
            [vec![e(S, 1), e(S, 0)], vec![e(K, 1), e(S, 2)], vec![e(K, 3), e(S, 1)]]
        );
        let skips = limited.iter().flatten().filter(|x| x.op == K).count();
        assert_eq!(skips, 2);
        // A limit that already holds changes nothing; 0 removes every skip.
        assert_eq!(derive_cell_limited(&a, &OPS, 3, 2, 6).expect("six"), plain);
        let none = derive_cell_limited(&a, &OPS, 3, 2, 0).expect("zero");
        assert!(none.iter().flatten().all(|x| x.op != K), "{none:?}");
    }

    #[test]
    fn only_the_normal_cell_is_limited_and_a_space_without_other_ops_is_an_error() {
        let a = alpha([5.0; 9]);
        let opt = DeriveOptions { max_skip: Some(1), ..Default::default() };
        let g = Genotype::derive_with(&a, &a, &OPS, 3, 2, &opt).expect("derived");
        assert_eq!(g.normal.iter().flatten().filter(|x| x.op == Primitive::SkipConnect).count(), 1);
        assert_eq!(g.reduce.iter().flatten().filter(|x| x.op == Primitive::SkipConnect).count(), 6);
        assert_eq!(
            Genotype::derive_with(&a, &a, &OPS, 3, 2, &DeriveOptions::default()).expect("plain"),
            Genotype::derive(&a, &a, &OPS, 3, 2).expect("plain")
        );
        let only_skip = [Primitive::None, Primitive::SkipConnect];
        let a2: Vec<Vec<f32>> = (0..9).map(|_| vec![0.0, 1.0]).collect();
        let err = derive_cell_limited(&a2, &only_skip, 3, 2, 1).expect_err("no other op");
        assert!(err.to_string().contains("no other op"), "{err}");
    }

    #[test]
    fn the_parameter_free_limit_takes_the_weakest_pool_or_skip_off_until_it_holds() {
        use Primitive::{MaxPool3x3 as M, SepConv3x3 as S, SkipConnect as K};
        // Every edge prefers max_pool (logit 3), then skip_connect (`skip[e]`), then sep_conv
        // (1.0): with skip at 2, an edge that loses its pool offers its skip next.
        let pools = |skip: [f32; 9]| -> Vec<Vec<f32>> {
            skip.iter()
                .enumerate()
                .map(|(e, &s)| vec![-5.0, 3.0 + 0.1 * e as f32, s, 1.0])
                .collect()
        };
        let a = pools([0.0; 9]);
        let plain = derive_cell(&a, &OPS, 3, 2).expect("derived");
        assert!(plain.iter().flatten().all(|x| x.op == M), "{plain:?}");
        let limited = |a: &[Vec<f32>], max: usize| {
            let opt = DeriveOptions { max_param_free: Some(max), ..Default::default() };
            Genotype::derive_with(a, a, &OPS, 3, 2, &opt).expect("limited")
        };
        // At most 4 of 6: the pools of the weakest edges go, lowest first. Node 2's pools
        // (edges 0, 1, weights rising with the edge) are the weakest, so node 2 turns to
        // sep_conv on both inputs; the other nodes keep their pools.
        let g = limited(&a, 4);
        assert_eq!(g.normal[0], [e(S, 0), e(S, 1)]);
        assert!(g.normal[1..].iter().flatten().all(|x| x.op == M), "{:?}", g.normal);
        // The reduction cell is not limited.
        assert_eq!(g.reduce, plain);
        // 0 leaves only convolutions, and a skip is parameter-free too: an edge that loses its
        // pool to the limit cannot keep its next best, skip_connect, either.
        let g = limited(&pools([2.0; 9]), 0);
        assert!(g.normal.iter().flatten().all(|x| x.op == S), "{:?}", g.normal);
        let g = limited(&pools([2.0; 9]), 3);
        let free = g.normal.iter().flatten().filter(|x| x.op == M || x.op == K).count();
        assert_eq!(free, 3, "{:?}", g.normal);
        // Both limits at once: at most 1 skip and 3 parameter-free ops.
        let both =
            DeriveOptions { max_skip: Some(1), max_param_free: Some(3), ..Default::default() };
        let mut skipped = pools([2.0; 9]);
        for row in &mut skipped {
            row[2] = 4.0; // skip first, pool second
        }
        let g = Genotype::derive_with(&skipped, &skipped, &OPS, 3, 2, &both).expect("both");
        let count = |op| g.normal.iter().flatten().filter(|x| x.op == op).count();
        assert_eq!((count(K), count(M) + count(K)), (1, 3), "{:?}", g.normal);
        // A limit that already holds changes nothing.
        assert_eq!(limited(&a, 6).normal, plain);
        // A space of parameter-free ops only cannot meet it.
        let free_only = [Primitive::None, Primitive::MaxPool3x3, Primitive::SkipConnect];
        let a3: Vec<Vec<f32>> = (0..9).map(|_| vec![0.0, 1.0, 0.5]).collect();
        let opt = DeriveOptions { max_param_free: Some(2), ..Default::default() };
        let err = Genotype::derive_with(&a3, &a3, &free_only, 3, 2, &opt).expect_err("no conv");
        assert!(err.to_string().contains("at most 2 parameter-free ops"), "{err}");
    }

    #[test]
    fn the_collapse_alert_counts_parameter_free_edges_of_the_normal_cell() {
        let g = qdarts_genotypes::known("DARTS_V2").expect("known");
        // DARTS_V2's normal cell: 6 sep/dil convs, 2 skip_connect.
        assert!((g.param_free_share() - 0.25).abs() < 1e-12);
        assert!(g.collapse_alert().is_none());
        let mut pooled = g.clone();
        for edges in &mut pooled.normal {
            for x in edges.iter_mut().take(2).skip(1) {
                x.op = Primitive::MaxPool3x3;
            }
        }
        // Four edges turned to pooling, two skips: 5 of 8 (one node had a skip in slot 1).
        let share = pooled.param_free_share();
        assert!(share > 0.5, "{share}");
        let alert = pooled.collapse_alert().expect("alert");
        assert!(alert.contains("of the normal cell's 8 edges"), "{alert}");
        assert!(Primitive::SepConv3x3.has_weights() && !Primitive::SkipConnect.has_weights());
    }
}

mod edge_normalization {
    use qdarts_genotypes::{DeriveOptions, Edge, Genotype, Primitive};

    #[test]
    fn pc_darts_ranks_edges_by_softmax_alpha_times_the_edge_weight() {
        let ops = [Primitive::None, Primitive::MaxPool3x3, Primitive::SepConv3x3];
        // Two nodes (5 edges). Of node 3's three inputs, edge 2 has the strongest op by α
        // alone, but β gives edges 3 and 4 most of the node's weight.
        let a: Vec<Vec<f32>> = vec![
            vec![0.0, 0.0, 1.0],
            vec![0.0, 1.0, 0.0],
            vec![0.0, 0.0, 3.0],
            vec![0.0, 0.0, 1.0],
            vec![0.0, 1.5, 0.0],
        ];
        let plain = Genotype::derive(&a, &a, &ops, 2, 2).unwrap();
        let sep = |input| Edge { op: Primitive::SepConv3x3, input };
        let max = |input| Edge { op: Primitive::MaxPool3x3, input };
        assert_eq!(plain.normal[1], [sep(0), max(2)]);
        // Edge weights (softmax of β within each node): node 2 even, node 3 mostly on 1 and 2.
        let scale = [0.5, 0.5, 0.1, 0.5, 0.4];
        let opt = DeriveOptions { edge_normal: Some(&scale), ..Default::default() };
        let g = Genotype::derive_with(&a, &a, &ops, 2, 2, &opt).unwrap();
        // softmax rows: edge 2 sep 0.909·0.1 = 0.091; edge 3 sep 0.576·0.5 = 0.288;
        // edge 4 max 0.692·0.4 = 0.277: edges 3 then 4.
        assert_eq!(g.normal[1], [sep(1), max(2)]);
        // The ops on each edge stay α's choice; the reduction cell is untouched.
        assert_eq!(g.reduce, plain.reduce);
        let bad = DeriveOptions { edge_normal: Some(&scale[..3]), ..Default::default() };
        assert!(Genotype::derive_with(&a, &a, &ops, 2, 2, &bad).is_err());
    }
}

mod bits {
    use qdarts_genotypes::{Bits, Genotype, known};

    fn with_bits() -> Genotype {
        let mut g = known("DARTS_V2").unwrap();
        let per = |cell: &[Vec<qdarts_genotypes::Edge>], w: u8| -> Vec<Vec<Bits>> {
            cell.iter().map(|n| n.iter().map(|_| Bits { weight: w, act: 8 }).collect()).collect()
        };
        g.normal_bits = Some(per(&g.normal, 4));
        g.reduce_bits = Some(per(&g.reduce, 2));
        g
    }

    #[test]
    fn bits_round_trip_through_json_and_stay_out_of_the_darts_text() {
        let g = with_bits();
        let json = String::from_utf8(g.to_json().unwrap()).unwrap();
        assert!(
            json.contains("\"normal_bits\"") && json.contains("[\n        4,\n        8\n      ]"),
            "{json}"
        );
        assert_eq!(Genotype::from_json(&json).unwrap(), g);
        // The text form is pt.darts' tuple: no bits, so it reads back without them.
        let text = g.to_darts_text();
        assert!(!text.contains("bits"));
        let back = Genotype::from_darts_text(&text).unwrap();
        assert_eq!(back.normal_bits, None);
        assert_eq!((back.normal, back.reduce), (g.normal.clone(), g.reduce.clone()));
        assert_eq!(Bits { weight: 4, act: 8 }.to_string(), "w4a8");
    }

    #[test]
    fn files_without_bits_still_load_and_are_written_as_before() {
        let old = r#"{"normal": [[["sep_conv_3x3", 0], ["skip_connect", 1]]], "normal_concat": [2],
            "reduce": [[["max_pool_3x3", 0], ["max_pool_3x3", 1]]], "reduce_concat": [2]}"#;
        let g = Genotype::from_json(old).unwrap();
        assert_eq!((g.normal_bits.as_ref(), g.reduce_bits.as_ref()), (None, None));
        let json = String::from_utf8(g.to_json().unwrap()).unwrap();
        assert!(!json.contains("bits"), "{json}");
    }

    #[test]
    fn bits_of_the_wrong_shape_or_range_are_refused() {
        let mut g = with_bits();
        g.normal_bits.as_mut().unwrap()[1].pop();
        let err =
            Genotype::from_json(&String::from_utf8(g.to_json().unwrap()).unwrap()).unwrap_err();
        assert!(err.to_string().contains("`normal_bits` has [2, 1, 2, 2] entries"), "{err}");
        let mut g = with_bits();
        g.reduce_bits.as_mut().unwrap()[0][0] = Bits { weight: 1, act: 8 };
        let err = g.validate().unwrap_err().to_string();
        assert!(err.contains("w1a8") && err.contains("2 to 8"), "{err}");
        let bad = r#"{"normal": [[["sep_conv_3x3", 0], ["skip_connect", 1]]], "normal_concat": [2],
            "reduce": [[["max_pool_3x3", 0], ["max_pool_3x3", 1]]], "reduce_concat": [2],
            "normal_bits": [[[4, 8, 2], [4, 8]]]}"#;
        assert!(Genotype::from_json(bad).is_err());
    }
}
