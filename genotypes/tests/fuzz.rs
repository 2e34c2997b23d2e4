//! The genotype readers under random and mutated input: DARTS text and JSON never panic, and
//! whatever they accept is a valid genotype that round-trips through both forms. Size limits
//! keep a hostile file from exhausting memory or the stack.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use qdarts_genotypes::{Genotype, KNOWN, MAX_EDGES, MAX_NODES};

/// Whatever was accepted is valid and survives both writers unchanged.
fn check_accepted(g: &Genotype) {
    g.validate().unwrap();
    assert_eq!(&Genotype::from_darts_text(&g.to_darts_text()).unwrap(), g);
    assert_eq!(
        &Genotype::from_json(std::str::from_utf8(&g.to_json().unwrap()).unwrap()).unwrap(),
        g
    );
}

fn read_both(text: &str) {
    if let Ok(g) = Genotype::from_darts_text(text) {
        check_accepted(&g);
    }
    if let Ok(g) = Genotype::from_json(text) {
        check_accepted(&g);
    }
}

/// A shipped genotype in either form, with `edits` applied: (position fraction, cut length,
/// inserted text).
fn mutated(which: usize, json: bool, edits: &[(f64, usize, String)]) -> String {
    let g = qdarts_genotypes::known(KNOWN[which % KNOWN.len()].0).unwrap();
    let mut s: Vec<char> = if json {
        String::from_utf8(g.to_json().unwrap()).unwrap().chars().collect()
    } else {
        g.to_darts_text().chars().collect()
    };
    for (at, cut, insert) in edits {
        let i = ((s.len() as f64) * at) as usize;
        let j = (i + cut).min(s.len());
        s.splice(i..j, insert.chars());
    }
    s.into_iter().collect()
}

/// Pieces of both grammars, so that random text gets past the lexer often.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("Genotype(".to_string()),
        Just("normal=".to_string()),
        Just("reduce=".to_string()),
        Just("normal_concat=".to_string()),
        Just("reduce_concat=".to_string()),
        Just("\"normal\":".to_string()),
        Just("range(".to_string()),
        Just("list(".to_string()),
        Just("('sep_conv_3x3', ".to_string()),
        Just("[\"max_pool_3x3\", ".to_string()),
        Just("'skip_connect'".to_string()),
        Just("none".to_string()),
        "[\\[\\](){},:=' \"\n]",
        (-3i64..12).prop_map(|i| i.to_string()),
        Just("99999999999999999999".to_string()),
        Just("-9223372036854775808".to_string()),
        "[a-z_0-9]{0,12}",
        any::<char>().prop_map(String::from),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        // Seeded: the same cases every run.
        rng_seed: RngSeed::Fixed(17),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_token_soup_never_panics(tokens in prop::collection::vec(token(), 0..60)) {
        read_both(&tokens.concat());
    }

    #[test]
    fn mutated_shipped_genotypes_never_panic(
        which in 0usize..64,
        json in any::<bool>(),
        edits in prop::collection::vec((0.0f64..1.0, 0usize..6, token()), 1..4),
    ) {
        read_both(&mutated(which, json, &edits));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        read_both(&String::from_utf8_lossy(&bytes));
    }
}

#[test]
fn oversized_cells_and_deep_nesting_are_refused() {
    // 2000 nodes (it used to abort on allocation when built).
    let nodes: Vec<String> =
        (0..2000).map(|i| format!("[('skip_connect', {}), ('skip_connect', 0)]", i + 1)).collect();
    let cell = format!("[{}]", nodes.join(", "));
    let text = format!(
        "Genotype(normal={cell}, normal_concat=range(2, 2002), reduce={cell}, reduce_concat=[2])"
    );
    let err = Genotype::from_darts_text(&text).unwrap_err().to_string();
    assert!(err.contains("more states than a cell may have"), "{err}");
    let text =
        format!("Genotype(normal={cell}, normal_concat=[2], reduce={cell}, reduce_concat=[2])");
    let err = Genotype::from_darts_text(&text).unwrap_err().to_string();
    assert!(err.contains(&format!("2000 nodes; at most {MAX_NODES}")), "{err}");
    // The same through JSON.
    let g = qdarts_genotypes::known("DARTS_V2").unwrap();
    let mut big = g.clone();
    big.normal = (0..MAX_NODES + 1).map(|_| g.normal[0].clone()).collect();
    let json = String::from_utf8(serde_json::to_vec(&big).unwrap()).unwrap();
    assert!(Genotype::from_json(&json).unwrap_err().to_string().contains("nodes; at most"));
    // Too many edges into one node, and a state concatenated twice.
    let mut wide = g.clone();
    wide.normal[0] = vec![g.normal[0][0]; MAX_EDGES + 1];
    assert!(wide.validate().unwrap_err().to_string().contains("edges; at most"));
    let mut twice = g.clone();
    twice.normal_concat = vec![2, 3, 3];
    assert!(twice.validate().unwrap_err().to_string().contains("state 3 twice"));
    // A cell of exactly MAX_NODES nodes is fine.
    let mut most = g.clone();
    most.normal = (0..MAX_NODES).map(|_| g.normal[0].clone()).collect();
    check_accepted(&most);
    // Brackets nested a million deep: an error, not a stack overflow.
    let deep = format!("Genotype(normal={}", "[".repeat(1_000_000));
    let err = Genotype::from_darts_text(&deep).unwrap_err().to_string();
    assert!(err.contains("nested deeper"), "{err}");
    let deep = format!("{{\"normal\": {}", "[".repeat(1_000_000));
    assert!(Genotype::from_json(&deep).is_err());
}
