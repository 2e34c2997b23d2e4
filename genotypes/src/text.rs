//! The DARTS text form of a genotype: a real parser (pt.darts uses `eval`) and a writer.
//!
//! Accepted: `Genotype(normal=..., normal_concat=..., reduce=..., reduce_concat=...)` with
//! keyword or positional arguments, optionally preceded by `NAME = `; cells as pt.darts' nested
//! lists (`[[('sep_conv_3x3', 0), ('sep_conv_3x3', 1)], ...]`, one list per node) or the
//! original DARTS flat list (`[('sep_conv_3x3', 0), ('sep_conv_3x3', 1), ...]`, two edges per
//! node); concat as `range(a, b)`, `range(b)` or a list. Quotes may be single or double;
//! trailing commas and `#` comments are allowed. Errors carry a line and column.

use crate::error::GenotypeError;
use crate::genotype::{Edge, Genotype};
use crate::primitive::Primitive;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Int(i64),
    Open(char),
    Close(char),
    Comma,
    Eq,
    End,
}

#[derive(Debug, Clone, Copy)]
struct Pos {
    line: usize,
    column: usize,
}

fn err(pos: Pos, message: impl Into<String>) -> GenotypeError {
    GenotypeError::Syntax { line: pos.line, column: pos.column, message: message.into() }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Ident(s) => format!("`{s}`"),
        Tok::Str(s) => format!("'{s}'"),
        Tok::Int(i) => format!("{i}"),
        Tok::Open(c) | Tok::Close(c) => format!("`{c}`"),
        Tok::Comma => "`,`".into(),
        Tok::Eq => "`=`".into(),
        Tok::End => "end of text".into(),
    }
}

fn lex(text: &str) -> Result<Vec<(Tok, Pos)>, GenotypeError> {
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let (mut i, mut line, mut col) = (0, 1, 1);
    while i < chars.len() {
        let c = chars[i];
        let pos = Pos { line, column: col };
        let advance = |n: usize, i: &mut usize, col: &mut usize| {
            *i += n;
            *col += n;
        };
        match c {
            '\n' => {
                i += 1;
                line += 1;
                col = 1;
            }
            c if c.is_whitespace() || c == '\\' => advance(1, &mut i, &mut col),
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '(' | '[' => {
                out.push((Tok::Open(c), pos));
                advance(1, &mut i, &mut col);
            }
            ')' | ']' => {
                out.push((Tok::Close(c), pos));
                advance(1, &mut i, &mut col);
            }
            ',' => {
                out.push((Tok::Comma, pos));
                advance(1, &mut i, &mut col);
            }
            '=' => {
                out.push((Tok::Eq, pos));
                advance(1, &mut i, &mut col);
            }
            '\'' | '"' => {
                let mut j = i + 1;
                while j < chars.len() && chars[j] != c && chars[j] != '\n' {
                    j += 1;
                }
                if j >= chars.len() || chars[j] != c {
                    return Err(err(pos, "unterminated string"));
                }
                out.push((Tok::Str(chars[i + 1..j].iter().collect()), pos));
                advance(j + 1 - i, &mut i, &mut col);
            }
            c if c.is_ascii_digit() || c == '-' => {
                let mut j = i + 1;
                while j < chars.len() && chars[j].is_ascii_digit() {
                    j += 1;
                }
                let s: String = chars[i..j].iter().collect();
                let v = s.parse::<i64>().map_err(|_| err(pos, format!("bad integer `{s}`")))?;
                out.push((Tok::Int(v), pos));
                advance(j - i, &mut i, &mut col);
            }
            c if c.is_alphabetic() || c == '_' => {
                let mut j = i + 1;
                while j < chars.len()
                    && (chars[j].is_alphanumeric() || chars[j] == '_' || chars[j] == '.')
                {
                    j += 1;
                }
                out.push((Tok::Ident(chars[i..j].iter().collect()), pos));
                advance(j - i, &mut i, &mut col);
            }
            other => return Err(err(pos, format!("unexpected character `{other}`"))),
        }
    }
    out.push((Tok::End, Pos { line, column: col }));
    Ok(out)
}

/// A parsed literal.
#[derive(Debug, Clone)]
enum Value {
    List(Vec<Value>, Pos),
    Tuple(Vec<Value>, Pos),
    Int(i64, Pos),
    Str(String, Pos),
    Range(i64, i64, Pos),
}

impl Value {
    fn pos(&self) -> Pos {
        match self {
            Value::List(_, p) | Value::Tuple(_, p) | Value::Int(_, p) | Value::Str(_, p) => *p,
            Value::Range(_, _, p) => *p,
        }
    }
}

struct Parser {
    toks: Vec<(Tok, Pos)>,
    at: usize,
    /// Brackets open around the current value.
    depth: usize,
}

/// Deeper nesting than any genotype needs is refused before it can exhaust the stack.
const MAX_DEPTH: usize = 16;

impl Parser {
    fn peek(&self) -> &(Tok, Pos) {
        &self.toks[self.at.min(self.toks.len() - 1)]
    }

    fn next(&mut self) -> (Tok, Pos) {
        let t = self.peek().clone();
        self.at += 1;
        t
    }

    fn expect(&mut self, want: Tok, what: &str) -> Result<Pos, GenotypeError> {
        let (t, pos) = self.next();
        if t == want {
            Ok(pos)
        } else {
            Err(err(pos, format!("expected {what}, found {}", describe(&t))))
        }
    }

    /// Items up to `close`, separated by commas, trailing comma allowed.
    fn items(&mut self, close: char) -> Result<Vec<Value>, GenotypeError> {
        let mut items = Vec::new();
        loop {
            if self.peek().0 == Tok::Close(close) {
                self.next();
                return Ok(items);
            }
            items.push(self.value()?);
            let (t, pos) = self.next();
            match t {
                Tok::Comma => {}
                Tok::Close(c) if c == close => return Ok(items),
                t => {
                    return Err(err(
                        pos,
                        format!("expected `,` or `{close}`, found {}", describe(&t)),
                    ));
                }
            }
        }
    }

    fn value(&mut self) -> Result<Value, GenotypeError> {
        if self.depth >= MAX_DEPTH {
            return Err(err(self.peek().1, format!("nested deeper than {MAX_DEPTH} brackets")));
        }
        self.depth += 1;
        let v = self.value_inner();
        self.depth -= 1;
        v
    }

    fn value_inner(&mut self) -> Result<Value, GenotypeError> {
        let (t, pos) = self.next();
        match t {
            Tok::Open('[') => Ok(Value::List(self.items(']')?, pos)),
            Tok::Open('(') => Ok(Value::Tuple(self.items(')')?, pos)),
            Tok::Int(v) => Ok(Value::Int(v, pos)),
            Tok::Str(s) => Ok(Value::Str(s, pos)),
            Tok::Ident(name) if name == "range" || name == "list" => {
                self.expect(Tok::Open('('), "`(`")?;
                let args = self.items(')')?;
                if name == "list" {
                    return match args.as_slice() {
                        [v] => Ok(v.clone()),
                        _ => Err(err(pos, "list(...) takes one argument")),
                    };
                }
                let ints: Vec<i64> = args
                    .iter()
                    .map(|a| match a {
                        Value::Int(i, _) => Ok(*i),
                        other => Err(err(other.pos(), "range(...) takes integers")),
                    })
                    .collect::<Result<_, _>>()?;
                match ints.as_slice() {
                    [b] => Ok(Value::Range(0, *b, pos)),
                    [a, b] => Ok(Value::Range(*a, *b, pos)),
                    _ => Err(err(pos, "range(...) takes one or two integers (no step)")),
                }
            }
            t => Err(err(
                pos,
                format!("expected a list, tuple, string, integer or range, found {}", describe(&t)),
            )),
        }
    }
}

fn to_index(v: i64, pos: Pos, what: &str) -> Result<usize, GenotypeError> {
    usize::try_from(v).map_err(|_| err(pos, format!("{what} must not be negative, got {v}")))
}

fn edge(v: &Value) -> Result<Edge, GenotypeError> {
    match v {
        Value::Tuple(items, pos) | Value::List(items, pos) => match items.as_slice() {
            [Value::Str(name, npos), Value::Int(input, ipos)] => Ok(Edge {
                op: name.parse::<Primitive>().map_err(|e| err(*npos, e.to_string()))?,
                input: to_index(*input, *ipos, "an edge's input")?,
            }),
            _ => Err(err(*pos, "an edge is ('op_name', input_index)")),
        },
        other => Err(err(other.pos(), "an edge is ('op_name', input_index)")),
    }
}

fn cell(v: &Value, name: &str) -> Result<Vec<Vec<Edge>>, GenotypeError> {
    let Value::List(items, pos) = v else {
        return Err(err(v.pos(), format!("`{name}` must be a list")));
    };
    match items.first() {
        None => Err(err(*pos, format!("`{name}` is empty"))),
        // pt.darts: one list of edges per node.
        Some(Value::List(inner, _))
            if inner.first().is_none_or(|x| !matches!(x, Value::Str(..))) =>
        {
            items
                .iter()
                .map(|node| match node {
                    Value::List(edges, _) => edges.iter().map(edge).collect(),
                    other => Err(err(other.pos(), "expected a list of edges for each node")),
                })
                .collect()
        }
        // DARTS: a flat list of edges, two per node.
        Some(_) => {
            if items.len() % 2 != 0 {
                return Err(err(
                    *pos,
                    format!(
                        "`{name}` is a flat edge list with {} edges; DARTS puts two per node",
                        items.len()
                    ),
                ));
            }
            let edges: Vec<Edge> = items.iter().map(edge).collect::<Result<_, _>>()?;
            Ok(edges.chunks(2).map(<[Edge]>::to_vec).collect())
        }
    }
}

fn concat(v: &Value, name: &str) -> Result<Vec<usize>, GenotypeError> {
    match v {
        Value::Range(a, b, pos) => {
            let (a, b) = (to_index(*a, *pos, "range start")?, to_index(*b, *pos, "range end")?);
            if b.saturating_sub(a) > crate::genotype::MAX_NODES + 2 {
                return Err(err(
                    *pos,
                    format!("`{name}` = range({a}, {b}) names more states than a cell may have"),
                ));
            }
            Ok((a..b).collect())
        }
        Value::List(items, _) | Value::Tuple(items, _) => items
            .iter()
            .map(|x| match x {
                Value::Int(i, p) => to_index(*i, *p, "a concat index"),
                other => Err(err(other.pos(), format!("`{name}` lists integers"))),
            })
            .collect(),
        other => Err(err(other.pos(), format!("`{name}` must be range(a, b) or a list"))),
    }
}

const FIELDS: [&str; 4] = ["normal", "normal_concat", "reduce", "reduce_concat"];

/// Parses the DARTS text form (not validated: see [`Genotype::from_darts_text`]).
pub fn parse(text: &str) -> Result<Genotype, GenotypeError> {
    let mut p = Parser { toks: lex(text)?, at: 0, depth: 0 };
    // Optional `NAME =` as in genotypes.py.
    if matches!(p.peek().0, Tok::Ident(ref n) if n != "Genotype")
        && p.toks.get(p.at + 1).is_some_and(|t| t.0 == Tok::Eq)
    {
        p.at += 2;
    }
    let (t, pos) = p.next();
    if t != Tok::Ident("Genotype".into()) {
        return Err(err(pos, format!("expected `Genotype(`, found {}", describe(&t))));
    }
    p.expect(Tok::Open('('), "`(` after Genotype")?;
    let mut fields: [Option<Value>; 4] = [None, None, None, None];
    let mut positional = 0;
    loop {
        if p.peek().0 == Tok::Close(')') {
            p.next();
            break;
        }
        let (slot, pos) = match (p.peek().clone(), p.toks.get(p.at + 1).map(|t| t.0.clone())) {
            ((Tok::Ident(name), pos), Some(Tok::Eq)) => {
                p.at += 2;
                let slot = FIELDS.iter().position(|f| *f == name).ok_or_else(|| {
                    err(
                        pos,
                        format!("unknown field `{name}`: expected one of {}", FIELDS.join(", ")),
                    )
                })?;
                (slot, pos)
            }
            ((_, pos), _) => {
                positional += 1;
                if positional > 4 {
                    return Err(err(pos, "Genotype takes four fields"));
                }
                (positional - 1, pos)
            }
        };
        if fields[slot].is_some() {
            return Err(err(pos, format!("field `{}` given twice", FIELDS[slot])));
        }
        fields[slot] = Some(p.value()?);
        let (t, pos) = p.next();
        match t {
            Tok::Comma => {}
            Tok::Close(')') => break,
            t => return Err(err(pos, format!("expected `,` or `)`, found {}", describe(&t)))),
        }
    }
    let (t, pos) = p.next();
    if t != Tok::End {
        return Err(err(pos, format!("unexpected {} after the genotype", describe(&t))));
    }
    let end = p.toks.last().map(|t| t.1).unwrap_or(Pos { line: 1, column: 1 });
    let [normal, normal_concat, reduce, reduce_concat] = fields;
    let need =
        |v: Option<Value>, name: &str| v.ok_or_else(|| err(end, format!("missing field `{name}`")));
    Ok(Genotype {
        normal: cell(&need(normal, "normal")?, "normal")?,
        normal_concat: concat(&need(normal_concat, "normal_concat")?, "normal_concat")?,
        reduce: cell(&need(reduce, "reduce")?, "reduce")?,
        reduce_concat: concat(&need(reduce_concat, "reduce_concat")?, "reduce_concat")?,
        normal_bits: None,
        reduce_bits: None,
    })
}

fn write_cell(nodes: &[Vec<Edge>]) -> String {
    let nodes: Vec<String> = nodes
        .iter()
        .map(|edges| {
            let e: Vec<String> =
                edges.iter().map(|e| format!("('{}', {})", e.op, e.input)).collect();
            format!("[{}]", e.join(", "))
        })
        .collect();
    format!("[{}]", nodes.join(", "))
}

fn write_concat(c: &[usize]) -> String {
    let contiguous = c.windows(2).all(|w| w[1] == w[0] + 1);
    match (c.first(), c.last()) {
        (Some(a), Some(b)) if contiguous => format!("range({a}, {})", b + 1),
        _ => format!("[{}]", c.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")),
    }
}

/// Writes the pt.darts form on one line.
pub fn write(g: &Genotype) -> String {
    format!(
        "Genotype(normal={}, normal_concat={}, reduce={}, reduce_concat={})",
        write_cell(&g.normal),
        write_concat(&g.normal_concat),
        write_cell(&g.reduce),
        write_concat(&g.reduce_concat)
    )
}
