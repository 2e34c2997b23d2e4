//! Random genotypes: valid, from the space without `none`, two distinct inputs per node, and
//! drawn uniformly.

use qdarts_genotypes::{Genotype, Primitive, random_genotype};

/// A seeded 64-bit LCG (Knuth's MMIX constants), its top bits scaled to `0..n`.
fn lcg(seed: u64) -> impl FnMut(usize) -> usize {
    let mut s = seed;
    move |n| {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (((s >> 33) as u128 * n as u128) >> 31) as usize
    }
}

#[test]
fn random_genotypes_are_valid_cells_of_the_space() {
    let mut below = lcg(1);
    for nodes in 1..=6 {
        for _ in 0..200 {
            let g = random_genotype(nodes, &Primitive::DARTS, &mut below).expect("drawn");
            g.validate().expect("valid");
            assert_eq!(g.normal.len(), nodes);
            assert_eq!(g.normal_concat, (2..nodes + 2).collect::<Vec<_>>());
            for (i, edges) in g.normal.iter().chain(&g.reduce).enumerate() {
                assert_eq!(edges.len(), 2);
                assert!(edges[0].input < edges[1].input, "node {i}: {edges:?}");
                assert!(edges.iter().all(|e| e.op != Primitive::None));
            }
            // Round trip through both file formats.
            assert_eq!(Genotype::from_darts_text(&g.to_darts_text()).expect("text"), g);
            let json = String::from_utf8(g.to_json().unwrap()).expect("utf8");
            assert_eq!(Genotype::from_json(&json).expect("json"), g);
        }
    }
}

#[test]
fn ops_and_input_pairs_are_drawn_uniformly() {
    // 4 nodes: the last node picks 2 of 5 states (10 pairs); 7 ops without `none`.
    let mut below = lcg(7);
    let draws = 20_000;
    let mut ops = std::collections::BTreeMap::new();
    let mut pairs = std::collections::BTreeMap::new();
    for _ in 0..draws {
        let g = random_genotype(4, &Primitive::DARTS, &mut below).expect("drawn");
        let last = &g.normal[3];
        *pairs.entry((last[0].input, last[1].input)).or_insert(0usize) += 1;
        for e in g.normal.iter().flatten() {
            *ops.entry(e.op).or_insert(0usize) += 1;
        }
    }
    assert_eq!(ops.len(), 7);
    let expect = (draws * 8) as f64 / 7.0;
    for (op, n) in &ops {
        // ±5 % of the expectation: about 10 standard deviations wide at these counts.
        assert!((*n as f64 - expect).abs() < 0.05 * expect, "{op}: {n} vs {expect}");
    }
    assert_eq!(pairs.len(), 10);
    let expect = draws as f64 / 10.0;
    for (pair, n) in &pairs {
        assert!((*n as f64 - expect).abs() < 0.1 * expect, "{pair:?}: {n} vs {expect}");
    }
}

#[test]
fn a_space_of_only_none_or_no_nodes_is_refused() {
    let mut below = lcg(3);
    assert!(random_genotype(4, &[Primitive::None], &mut below).is_err());
    assert!(random_genotype(0, &Primitive::DARTS, &mut below).is_err());
    let g =
        random_genotype(2, &[Primitive::None, Primitive::SkipConnect], &mut below).expect("skip");
    assert_eq!(g.primitives(), [Primitive::SkipConnect]);
}
