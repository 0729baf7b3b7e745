//! Nesting depth, measured on the text before any YAML parser sees it. libyaml (behind
//! serde_yaml_ng, and so behind kube's kubeconfig reader) rescans every open flow level on
//! every token, so a document of 100,000 nested `{` costs minutes before its recursion limit
//! answers. One pass over the bytes here keeps a stack of block columns (one per `- `, `? `,
//! `: ` indicator and per node a line starts) and a count of open flow brackets, and stops at
//! the first place where the two together pass [`MAX_DEPTH`], with its line and column.
//!
//! The pass follows libyaml's tokens where a quote may start a string (a bracket inside a
//! string does not nest), and where they could disagree it counts more rather than less: a
//! text the parser nests deeply is never let through; one with many unclosed brackets inside
//! odd plain scalars may be refused, by an error that says where.

/// Levels of nesting (block collections and flow brackets together) a document may have.
/// Flotilla's kinds nest about ten deep; serde_yaml_ng stops at 128 (after the cost).
pub const MAX_DEPTH: usize = 64;

/// Where nesting first passed [`MAX_DEPTH`] (1-based, in the text given).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooDeep {
    /// Line.
    pub line: usize,
    /// Column.
    pub column: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between tokens: a quote here starts a string.
    Token,
    /// Inside a plain scalar: quotes are characters.
    Plain,
    /// Inside a quoted string (`'` or `"`), possibly over several lines.
    Quoted(u8),
}

/// `Err` with the place where `text` nests past [`MAX_DEPTH`]. Linear in the text's length.
pub fn check(text: &str) -> Result<(), TooDeep> {
    let mut scan = Scan { blocks: Vec::new(), flow: 0, state: State::Token, block_scalar: None, plain_open: false };
    for (index, line) in text.split('\n').enumerate() {
        scan.line(line.as_bytes(), index + 1)?;
    }
    Ok(())
}

struct Scan {
    /// Columns of the open block nodes, increasing.
    blocks: Vec<usize>,
    /// Open flow brackets.
    flow: usize,
    state: State,
    /// Inside a block scalar whose parent node sits at this column (`-1`: top level).
    block_scalar: Option<isize>,
    /// The previous line ended inside a block plain scalar, which the next may continue.
    plain_open: bool,
}

fn blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r')
}

fn flow_indicator(b: u8) -> bool {
    matches!(b, b',' | b'[' | b']' | b'{' | b'}')
}

impl Scan {
    fn depth(&self) -> usize {
        self.blocks.len() + self.flow
    }

    fn deeper(&self, line: usize, at: usize) -> Result<(), TooDeep> {
        if self.depth() > MAX_DEPTH { Err(TooDeep { line, column: at + 1 }) } else { Ok(()) }
    }

    fn line(&mut self, bytes: &[u8], line: usize) -> Result<(), TooDeep> {
        let indent = bytes.iter().take_while(|&&b| b == b' ').count();
        let empty = bytes[indent..].iter().all(|&b| blank(b));
        if let Some(parent) = self.block_scalar {
            if empty || indent as isize > parent {
                return Ok(());
            }
            self.block_scalar = None;
        }
        let mut i = 0;
        if self.flow == 0 && !matches!(self.state, State::Quoted(_)) {
            if empty || bytes[indent] == b'#' {
                // A comment line ends a plain scalar; a blank one does not.
                self.plain_open &= empty;
                return Ok(());
            }
            let marker =
                (bytes.starts_with(b"---") || bytes.starts_with(b"...")) && bytes.get(3).is_none_or(|&b| blank(b));
            if marker || bytes[0] == b'%' {
                // A document boundary or a directive: nothing stays open across it.
                *self =
                    Scan { blocks: Vec::new(), flow: 0, state: State::Token, block_scalar: None, plain_open: false };
                if bytes[0] == b'%' || bytes.len() == 3 {
                    return Ok(());
                }
                i = 3;
            } else {
                i = self.block_start(bytes, indent, line)?;
            }
        }
        self.rest(bytes, i, line)
    }

    /// Pushes the columns of the block nodes this line opens; the index to go on from.
    fn block_start(&mut self, bytes: &[u8], indent: usize, line: usize) -> Result<usize, TooDeep> {
        // A line after an unfinished plain scalar may continue it: its leading quote is then a
        // character, not a string (counting the brackets after it, not skipping them).
        let continues = std::mem::take(&mut self.plain_open);
        while self.blocks.last().is_some_and(|&c| c >= indent) {
            self.blocks.pop();
        }
        let mut i = indent;
        loop {
            self.blocks.push(i);
            self.deeper(line, i)?;
            let indicator =
                matches!(bytes.get(i), Some(b'-' | b'?' | b':')) && bytes.get(i + 1).is_none_or(|&b| blank(b));
            if !indicator {
                break;
            }
            i += 1;
            while bytes.get(i).is_some_and(|&b| blank(b)) {
                i += 1;
            }
            if i >= bytes.len() || bytes[i] == b'#' {
                return Ok(i);
            }
        }
        if continues && matches!(bytes.get(i), Some(b'\'' | b'"')) {
            self.state = State::Plain;
            return Ok(i + 1);
        }
        Ok(i)
    }

    /// Scans `bytes[i..]`: flow brackets, strings, comments, block scalar headers.
    fn rest(&mut self, bytes: &[u8], mut i: usize, line: usize) -> Result<(), TooDeep> {
        while i < bytes.len() {
            let b = bytes[i];
            match self.state {
                State::Quoted(q) => {
                    if q == b'"' && b == b'\\' {
                        i += 1;
                    } else if b == q {
                        if q == b'\'' && bytes.get(i + 1) == Some(&b'\'') {
                            i += 1;
                        } else {
                            self.state = State::Token;
                        }
                    }
                }
                State::Plain => {
                    let next_ends = bytes.get(i + 1).is_none_or(|&n| blank(n) || (self.flow > 0 && flow_indicator(n)));
                    if b == b':' && next_ends {
                        self.state = State::Token;
                    } else if blank(b) && bytes.get(i + 1) == Some(&b'#') {
                        break;
                    } else if self.flow > 0 && flow_indicator(b) {
                        self.state = State::Token;
                        continue;
                    }
                }
                State::Token => match b {
                    b' ' | b'\t' | b'\r' | b',' => {}
                    b'#' => break,
                    b'{' | b'[' => {
                        self.flow += 1;
                        self.deeper(line, i)?;
                    }
                    b'}' | b']' => self.flow = self.flow.saturating_sub(1),
                    b'\'' | b'"' => self.state = State::Quoted(b),
                    b'-' | b'?' | b':' if bytes.get(i + 1).is_none_or(|&n| blank(n)) => {}
                    b':' if self.flow > 0 => {}
                    b'&' | b'*' | b'!' => {
                        i += 1;
                        while bytes.get(i).is_some_and(|&n| !blank(n) && !flow_indicator(n)) {
                            i += 1;
                        }
                        continue;
                    }
                    b'|' | b'>' if self.flow == 0 => {
                        // The parent: the innermost block node left of the indicator.
                        let parent = self.blocks.iter().rev().find(|&&c| c < i).map_or(-1, |&c| c as isize);
                        self.block_scalar = Some(parent);
                        return Ok(());
                    }
                    _ => self.state = State::Plain,
                },
            }
            i += 1;
        }
        // In flow, a plain scalar goes on at the next line's first character; in block, the
        // next line decides (`block_start`). A string goes on either way.
        if self.flow == 0 && self.state == State::Plain {
            self.plain_open = true;
            self.state = State::Token;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "depth_tests.rs"]
mod tests;
