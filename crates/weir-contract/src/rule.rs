//! Rules: the CEL subset that `where` is written in (SPEC.md section 5).
//!
//! Field paths, string / number / bool / null literals, `== != < <= > >=`,
//! `&& || !`, `in [..]`, `has(a.b)` and parentheses. This module only parses;
//! the engine evaluates a [`Expr`] against an event.

use std::fmt;

/// A dotted field path (`acct.id`), split into its segments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPath {
    segments: Vec<String>,
}

impl FieldPath {
    /// Parses `a.b.c`; every segment must be non-empty.
    pub fn parse(text: &str) -> Result<FieldPath, String> {
        if text.is_empty() {
            return Err("empty field path; name a field such as \"account_id\" or \"acct.id\"".into());
        }
        let segments: Vec<String> = text.split('.').map(str::to_owned).collect();
        if segments.iter().any(String::is_empty) {
            return Err(format!(
                "`{text}` is not a field path: a segment is empty; write segments joined by dots, e.g. \"acct.id\""
            ));
        }
        Ok(FieldPath { segments })
    }

    pub fn segments(&self) -> &[String] {
        &self.segments
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.segments.join("."))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

/// A parsed rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Null,
    Bool(bool),
    /// A number literal, kept as its exact text (`12.50`, `-3`, `1e3`).
    Number(String),
    Str(String),
    List(Vec<Expr>),
    Field(FieldPath),
    Has(FieldPath),
    Not(Box<Expr>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
    In(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

/// Nesting deeper than this is refused, so a hostile rule cannot exhaust the stack.
const DEPTH_MAX: usize = 64;

/// Parses a rule; the error names the column and what was expected.
pub fn parse_rule(text: &str) -> Result<Expr, String> {
    let tokens = lex(text)?;
    let mut parser = Parser { tokens, pos: 0, depth: 0 };
    let expr = parser.or()?;
    match parser.peek() {
        Tok::End => Ok(expr),
        _ => Err(format!(
            "unexpected {} at column {}; a rule is one expression such as 'status == \"approved\" && amount > 0'",
            parser.peek().describe(),
            parser.column()
        )),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Number(String),
    Str(String),
    Op(&'static str),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(name) => format!("`{name}`"),
            Tok::Number(text) => format!("number {text}"),
            Tok::Str(text) => format!("string {text:?}"),
            Tok::Op(op) => format!("`{op}`"),
            Tok::End => "end of rule".into(),
        }
    }
}

fn lex(text: &str) -> Result<Vec<(Tok, usize)>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), column));
            continue;
        }
        if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            out.push((Tok::Number(chars[start..i].iter().collect()), column));
            continue;
        }
        if c == '"' || c == '\'' {
            let (value, next) = lex_string(&chars, i)?;
            out.push((Tok::Str(value), column));
            i = next;
            continue;
        }
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        let op = match two.as_str() {
            "==" | "!=" | "<=" | ">=" | "&&" | "||" => Some(two.as_str()),
            _ => None,
        };
        if let Some(op) = op {
            let op: &'static str = match op {
                "==" => "==",
                "!=" => "!=",
                "<=" => "<=",
                ">=" => ">=",
                "&&" => "&&",
                _ => "||",
            };
            out.push((Tok::Op(op), column));
            i += 2;
            continue;
        }
        let op: &'static str = match c {
            '<' => "<",
            '>' => ">",
            '!' => "!",
            '(' => "(",
            ')' => ")",
            '[' => "[",
            ']' => "]",
            ',' => ",",
            '.' => ".",
            '-' => "-",
            _ => {
                return Err(format!(
                    "unexpected character `{c}` at column {column}; rules use field paths, literals, == != < <= > >= && || ! in has() and parentheses"
                ))
            }
        };
        out.push((Tok::Op(op), column));
        i += 1;
    }
    out.push((Tok::End, chars.len() + 1));
    Ok(out)
}

fn lex_string(chars: &[char], start: usize) -> Result<(String, usize), String> {
    let quote = chars[start];
    let mut value = String::new();
    let mut i = start + 1;
    while i < chars.len() {
        let c = chars[i];
        if c == quote {
            return Ok((value, i + 1));
        }
        if c == '\\' {
            let escaped = chars
                .get(i + 1)
                .copied()
                .ok_or_else(|| format!("unfinished escape at column {}; close the string", i + 1))?;
            value.push(match escaped {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                '\\' => '\\',
                '"' => '"',
                '\'' => '\'',
                other => {
                    return Err(format!(
                        "unknown escape `\\{other}` at column {}; use \\n \\t \\r \\\\ \\\" or \\'",
                        i + 1
                    ))
                }
            });
            i += 2;
            continue;
        }
        value.push(c);
        i += 1;
    }
    Err(format!("string starting at column {} is not closed; add the closing {quote}", start + 1))
}

struct Parser {
    tokens: Vec<(Tok, usize)>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.tokens[self.pos].0
    }

    fn column(&self) -> usize {
        self.tokens[self.pos].1
    }

    fn next(&mut self) -> Tok {
        let tok = self.tokens[self.pos].0.clone();
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
        tok
    }

    fn eat(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Tok::Op(o) if *o == op) {
            self.next();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, op: &str) -> Result<(), String> {
        if self.eat(op) {
            Ok(())
        } else {
            Err(format!("expected `{op}` at column {}, found {}", self.column(), self.peek().describe()))
        }
    }

    fn enter(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > DEPTH_MAX {
            return Err(format!("rule nests deeper than {DEPTH_MAX} levels; simplify it"));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, String> {
        self.enter()?;
        let mut left = self.and()?;
        while self.eat("||") {
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        self.depth -= 1;
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.relation()?;
        while self.eat("&&") {
            let right = self.relation()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn relation(&mut self) -> Result<Expr, String> {
        let mut left = self.unary()?;
        loop {
            let op = match self.peek() {
                Tok::Op("==") => CmpOp::Eq,
                Tok::Op("!=") => CmpOp::Ne,
                Tok::Op("<") => CmpOp::Lt,
                Tok::Op("<=") => CmpOp::Le,
                Tok::Op(">") => CmpOp::Gt,
                Tok::Op(">=") => CmpOp::Ge,
                Tok::Ident(word) if word == "in" => {
                    self.next();
                    let right = self.unary()?;
                    left = Expr::In(Box::new(left), Box::new(right));
                    continue;
                }
                _ => return Ok(left),
            };
            self.next();
            let right = self.unary()?;
            left = Expr::Cmp(op, Box::new(left), Box::new(right));
        }
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.eat("!") {
            self.enter()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        if self.eat("-") {
            let column = self.column();
            return match self.next() {
                Tok::Number(text) => Ok(Expr::Number(format!("-{text}"))),
                other => Err(format!(
                    "`-` at column {} must be followed by a number, found {}",
                    column.saturating_sub(1),
                    other.describe()
                )),
            };
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let column = self.column();
        match self.next() {
            Tok::Number(text) => Ok(Expr::Number(text)),
            Tok::Str(text) => Ok(Expr::Str(text)),
            Tok::Op("(") => {
                let inner = self.or()?;
                self.expect(")")?;
                Ok(inner)
            }
            Tok::Op("[") => {
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.or()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                Ok(Expr::List(items))
            }
            Tok::Ident(word) => match word.as_str() {
                "true" => Ok(Expr::Bool(true)),
                "false" => Ok(Expr::Bool(false)),
                "null" => Ok(Expr::Null),
                "has" if matches!(self.peek(), Tok::Op("(")) => {
                    self.next();
                    let path = self.path()?;
                    self.expect(")")?;
                    Ok(Expr::Has(path))
                }
                "in" => Err(format!("`in` at column {column} needs a value on its left")),
                _ => {
                    let mut segments = vec![word];
                    while self.eat(".") {
                        segments.push(self.ident()?);
                    }
                    Ok(Expr::Field(FieldPath { segments }))
                }
            },
            other => Err(format!(
                "expected a field, a literal, `!`, `(` or `[` at column {column}, found {}",
                other.describe()
            )),
        }
    }

    fn path(&mut self) -> Result<FieldPath, String> {
        let mut segments = vec![self.ident()?];
        while self.eat(".") {
            segments.push(self.ident()?);
        }
        Ok(FieldPath { segments })
    }

    fn ident(&mut self) -> Result<String, String> {
        let column = self.column();
        match self.next() {
            Tok::Ident(word) => Ok(word),
            other => Err(format!("expected a field name at column {column}, found {}", other.describe())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(path: &str) -> Box<Expr> {
        Box::new(Expr::Field(FieldPath::parse(path).unwrap()))
    }

    #[test]
    fn parses_the_spec_forms() {
        assert_eq!(
            parse_rule(r#"status == "approved""#).unwrap(),
            Expr::Cmp(CmpOp::Eq, field("status"), Box::new(Expr::Str("approved".into())))
        );
        assert_eq!(
            parse_rule("has(acct.id) && acct.id != 'x'").unwrap(),
            Expr::And(
                Box::new(Expr::Has(FieldPath::parse("acct.id").unwrap())),
                Box::new(Expr::Cmp(CmpOp::Ne, field("acct.id"), Box::new(Expr::Str("x".into()))))
            )
        );
        assert!(matches!(parse_rule(r#"status in ["a", "b"]"#).unwrap(), Expr::In(_, _)));
        assert!(matches!(parse_rule("!(a == 1) || b >= -2.5").unwrap(), Expr::Or(_, _)));
        assert_eq!(parse_rule("x == null").unwrap(), Expr::Cmp(CmpOp::Eq, field("x"), Box::new(Expr::Null)));
    }

    #[test]
    fn and_binds_tighter_than_or() {
        let Expr::Or(_, right) = parse_rule("a == 1 || b == 2 && c == 3").unwrap() else { panic!("expected ||") };
        assert!(matches!(*right, Expr::And(_, _)));
    }

    #[test]
    fn refusals_name_the_column() {
        for (text, needle) in [
            ("status ==", "column 10"),
            ("status = 'a'", "column 8"),
            ("'open", "not closed"),
            ("(a == 1", "expected `)`"),
            ("a == 1 b", "column 8"),
            ("", "column 1"),
            ("a ~ b", "character `~`"),
        ] {
            let err = parse_rule(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let text = format!("{}a{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(parse_rule(&text).unwrap_err().contains("deeper"));
        let bangs = format!("{}a", "!".repeat(10_000));
        assert!(parse_rule(&bangs).unwrap_err().contains("deeper"));
    }
}
