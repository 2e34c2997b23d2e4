//! A DARTS cell's edges in waves: the edges that read states ready at the same time
//! (docs/design/waves.md).
//!
//! Node `i` (from 0) of a cell of `N` nodes reads the two inputs (states 0 and 1) and the nodes
//! before it (state `2 + j` is node `j`), one edge each; [`SearchCell`](super::SearchCell)
//! numbers its edges node by node, inputs in increasing order. The edges from the two inputs
//! can run first (wave 0, `2·N` edges); node `j` then feeds the `N − 1 − j` edges of the nodes
//! after it (wave `j + 1`), so a cell is `N` waves and node `j` is complete once wave `j` has
//! run.

use std::ops::Range;

/// One wave: its edges, grouped by the state they read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    /// The states the wave reads, in increasing order (0 and 1 for wave 0, else one node's).
    pub sources: Vec<usize>,
    /// Its edges as the cell numbers them, source by source (`sources`' order), each source's
    /// edges by the node they feed.
    pub edges: Vec<usize>,
    /// For each of `edges`, its position in `sources`.
    pub source_of: Vec<usize>,
    /// For each of `edges`, the node it feeds.
    pub node_of: Vec<usize>,
    /// The nodes the wave feeds: one edge per source each.
    pub fed: Range<usize>,
}

impl Wave {
    /// How many edges read each source, in `sources`' order (every source feeds every node of
    /// `fed` once, so this is `fed.len()` for each).
    pub fn per_source(&self) -> usize {
        self.fed.len()
    }
}

/// The index [`SearchCell`](super::SearchCell) gives the edge from state `state` into node
/// `node`.
pub fn edge_index(node: usize, state: usize) -> usize {
    node * (node + 3) / 2 + state
}

/// The waves of a cell of `nodes` intermediate nodes, in the order they run.
pub fn waves(nodes: usize) -> Vec<Wave> {
    let wave = |sources: Vec<usize>, fed: Range<usize>| {
        let (mut edges, mut source_of, mut node_of) = (Vec::new(), Vec::new(), Vec::new());
        for (s, &state) in sources.iter().enumerate() {
            for node in fed.clone() {
                edges.push(edge_index(node, state));
                source_of.push(s);
                node_of.push(node);
            }
        }
        Wave { sources, edges, source_of, node_of, fed }
    };
    let mut out = vec![wave(vec![0, 1], 0..nodes)];
    for j in 0..nodes.saturating_sub(1) {
        out.push(wave(vec![2 + j], j + 1..nodes));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waves_cover_every_edge_once_and_read_only_finished_states() {
        for nodes in 1..=6 {
            let ws = waves(nodes);
            assert_eq!(ws.len(), nodes);
            let mut seen: Vec<usize> = ws.iter().flat_map(|w| w.edges.clone()).collect();
            seen.sort_unstable();
            let total = (0..nodes).map(|i| i + 2).sum::<usize>();
            assert_eq!(seen, (0..total).collect::<Vec<_>>(), "{nodes} nodes");
            // Node j is complete after wave j: a wave reads only inputs and complete nodes.
            for (w, wave) in ws.iter().enumerate() {
                for &s in &wave.sources {
                    assert!(s < 2 || s - 2 < w, "wave {w} reads node {}", s - 2);
                }
                assert_eq!(wave.edges.len(), wave.sources.len() * wave.per_source());
            }
        }
    }

    #[test]
    fn the_darts_cell_has_waves_of_8_3_2_and_1_edges() {
        let ws = waves(4);
        let sizes: Vec<usize> = ws.iter().map(|w| w.edges.len()).collect();
        assert_eq!(sizes, [8, 3, 2, 1]);
        // Edges numbered as the cell builds them: node 0 reads states 0, 1 (edges 0, 1),
        // node 1 states 0, 1, 2 (edges 2, 3, 4), and so on.
        assert_eq!(ws[0].edges, [0, 2, 5, 9, 1, 3, 6, 10]);
        assert_eq!(ws[1].edges, [4, 7, 11]);
        assert_eq!(ws[3].edges, [13]);
        assert_eq!(ws[1].node_of, [1, 2, 3]);
    }
}
