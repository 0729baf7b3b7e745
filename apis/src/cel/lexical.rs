//! The nesting check that runs before a selector reaches the parser. CEL's generated parser
//! and its evaluator recurse once per level of the expression, with large frames, so a deep
//! expression overflows the stack (on a fresh 2 MiB thread, a Tokio worker's size, parsing
//! died past 12 nested parentheses in a debug build; evaluation past ~55 chained `+`). This scan reads only tokens: it skips string literals (quoted, triple-quoted, raw,
//! bytes) and `//` comments, and estimates how deep the syntax tree gets: one level per open
//! bracket, plus one per operator or member access chained at a level (`a.b.c`, `x + y + z`,
//! `c ? d : e ? f : g`), which the parser nests left or right. `&&`, `||`, `,` and `:` end a
//! chain (the parser balances logical chains). Whitespace and comments change nothing.

/// The deepest estimated nesting accepted.
pub const MAX_NESTING: usize = 32;

/// Where the estimate first passed [`MAX_NESTING`]: (depth, 1-based line, 1-based column).
pub type TooDeep = (usize, usize, usize);

#[derive(Default)]
struct Level {
    chain: usize,
    ternary: usize,
}

/// Scans `expression`; `Err` names the first place nested deeper than [`MAX_NESTING`].
pub fn check_nesting(expression: &str) -> Result<usize, TooDeep> {
    let chars: Vec<char> = expression.chars().collect();
    let mut levels: Vec<Level> = vec![Level::default()];
    let (mut i, mut line, mut column) = (0usize, 1usize, 1usize);
    let mut max = 1usize;
    // Whether the previous token ends an operand (so `(`/`[` are a call/index, not a group).
    let mut after_operand = false;
    let advance = |i: &mut usize, line: &mut usize, column: &mut usize, n: usize, chars: &[char]| {
        for c in chars.iter().skip(*i).take(n) {
            if *c == '\n' {
                *line += 1;
                *column = 1;
            } else {
                *column += 1;
            }
        }
        *i += n;
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let (at_line, at_column) = (line, column);
        let mut chained = 0usize;
        let mut operand = false;
        let len;
        if c.is_whitespace() {
            advance(&mut i, &mut line, &mut column, 1, &chars);
            continue;
        } else if c == '/' && next == Some('/') {
            let n = chars[i..].iter().position(|c| *c == '\n').unwrap_or(chars.len() - i);
            advance(&mut i, &mut line, &mut column, n, &chars);
            continue;
        } else if let Some(n) = string_literal(&chars[i..]) {
            len = n;
            operand = true;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let mut n = 1;
            let number = c.is_ascii_digit();
            while let Some(&d) = chars.get(i + n) {
                let exponent_sign = number && matches!(d, '+' | '-') && matches!(chars[i + n - 1], 'e' | 'E');
                let fraction = number && d == '.' && chars.get(i + n + 1).is_some_and(char::is_ascii_digit);
                if d.is_ascii_alphanumeric() || d == '_' || fraction || exponent_sign {
                    n += 1;
                } else {
                    break;
                }
            }
            len = n;
            operand = true;
        } else {
            let two: String = chars[i..].iter().take(2).collect();
            len = if matches!(two.as_str(), "&&" | "||" | "==" | "!=" | "<=" | ">=") { 2 } else { 1 };
            let current = levels.last_mut();
            match (two.as_str(), c) {
                ("&&" | "||", _) | (_, ',' | ':') => {
                    if let Some(level) = current {
                        level.chain = 0;
                        if c == ',' {
                            level.ternary = 0;
                        }
                    }
                }
                (_, '?') => {
                    if let Some(level) = current {
                        level.ternary += 1;
                    }
                }
                (_, '(' | '[' | '{') => {
                    if after_operand && c != '{' {
                        chained = 1;
                    }
                    if let Some(level) = current {
                        level.chain += chained;
                    }
                    levels.push(Level::default());
                }
                (_, ')' | ']' | '}') => {
                    if levels.len() > 1 {
                        levels.pop();
                    }
                    operand = true;
                }
                (_, '.' | '+' | '-' | '*' | '/' | '%' | '<' | '>') | ("==" | "!=" | "<=" | ">=", _) => {
                    if let Some(level) = current {
                        level.chain += 1;
                    }
                }
                _ => {}
            }
        }
        if operand && (c == 'i' && chars.get(i + 1) == Some(&'n') && len == 2) {
            // `in` is a relation, not an operand.
            operand = false;
            if let Some(level) = levels.last_mut() {
                level.chain += 1;
            }
        }
        let depth: usize = levels.iter().map(|l| 1 + l.chain + l.ternary).sum();
        max = max.max(depth);
        if depth > MAX_NESTING {
            return Err((depth, at_line, at_column));
        }
        after_operand = operand;
        advance(&mut i, &mut line, &mut column, len, &chars);
    }
    Ok(max)
}

/// The length of the string or bytes literal starting at `s[0]`, if one starts there
/// (an unterminated one runs to the end; the parser reports it).
fn string_literal(s: &[char]) -> Option<usize> {
    let mut p = 0;
    let mut raw = false;
    while p < 2 && s.get(p).is_some_and(|c| matches!(c, 'r' | 'R' | 'b' | 'B')) {
        raw |= matches!(s[p], 'r' | 'R');
        p += 1;
    }
    let quote = *s.get(p).filter(|c| matches!(c, '"' | '\''))?;
    let triple = s.get(p + 1) == Some(&quote) && s.get(p + 2) == Some(&quote);
    let mut i = p + if triple { 3 } else { 1 };
    while i < s.len() {
        if s[i] == '\\' && !raw {
            i += 2;
            continue;
        }
        if s[i] == quote && (!triple || (s.get(i + 1) == Some(&quote) && s.get(i + 2) == Some(&quote))) {
            return Some(i + if triple { 3 } else { 1 });
        }
        if s[i] == '\n' && !triple {
            return Some(i);
        }
        i += 1;
    }
    Some(s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_selectors_are_shallow() {
        for e in [
            r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0"#,
            r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100") && device.driver == "gpu.nvidia.com""#,
            "[1, 2, 3].all(x, [4, 5].exists(y, x + y > 2))",
        ] {
            let depth = check_nesting(e).unwrap_or(usize::MAX);
            assert!(depth <= 12, "{e}: {depth}");
        }
    }

    #[test]
    fn deep_brackets_are_refused_with_their_position() {
        let e = format!("{}true{}", "(".repeat(55), ")".repeat(55));
        assert_eq!(check_nesting(&e), Err((MAX_NESTING + 1, 1, MAX_NESTING)));
        let e = format!("device.driver == 'x' &&\n  {}1{} == 1", "[".repeat(40), "]".repeat(40));
        let Err((_, line, column)) = check_nesting(&e) else { panic!("not refused") };
        assert_eq!((line, column), (2, 3 + MAX_NESTING - 1));
    }

    #[test]
    fn long_chains_count_but_logic_and_whitespace_do_not() {
        assert!(check_nesting(&format!("1{}", " + 1".repeat(40))).is_err());
        assert!(check_nesting(&format!("x{}", ".a".repeat(40))).is_err());
        assert!(check_nesting(&format!("{}true", "true ? true : ".repeat(40))).is_err());
        assert!(check_nesting(&format!("true{}", " && true".repeat(400))).is_ok());
        let spaced = format!("{}true{}", "( \n ".repeat(40), " )".repeat(40));
        assert!(check_nesting(&spaced).is_err(), "whitespace does not hide nesting");
    }

    #[test]
    fn brackets_inside_strings_and_comments_do_not_count() {
        let s = "(".repeat(100);
        assert!(check_nesting(&format!("device.driver == '{s}'")).is_ok());
        assert!(check_nesting(&format!("device.driver == \"\"\"{s}\n{s}\"\"\"")).is_ok());
        assert!(check_nesting(&format!("device.driver == r'\\' // {s}\n")).is_ok());
        assert!(check_nesting(&format!("device.driver == 'x' // it's {s}\n")).is_ok());
    }
}
