//! Where a problem's field is written: the line and column of `spec.pools[0].maxNodes` in the
//! text of its document, so that an editor or a CI annotation lands on the field rather than on
//! the document's first line. Block-style YAML is followed key by key and item by item; where
//! the text stops being block style (a flow mapping or list, JSON on one line) the deepest part
//! of the path found is returned. Nothing found: `None` (the document's line stands).

/// One step of a field path.
#[derive(Debug, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `spec.pools[0].maxNodes` → `spec`, `pools`, 0, `maxNodes`; `None` for a path it cannot read.
fn steps(field: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Step::Key(key));
        }
        while !rest.is_empty() {
            let (n, after) = rest.split_once(']')?;
            out.push(Step::Index(n.parse().ok()?));
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    Some(out)
}

/// A line's content: (column of the first character after the indentation and any `- `
/// markers, whether it starts with a `-` item marker at `dash` column, the text from there).
struct Content<'a> {
    dash: Option<usize>,
    col: usize,
    text: &'a str,
}

fn content(line: &str) -> Option<Content<'_>> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    if rest.is_empty() || rest.starts_with('#') {
        return None;
    }
    if rest == "-" || rest.starts_with("- ") {
        let after = rest[1..].trim_start_matches(' ');
        let col = line.len() - after.len();
        return Some(Content { dash: Some(indent), col, text: after });
    }
    Some(Content { dash: None, col: indent, text: rest })
}

/// The key a line's content starts with (`name:`, `"name":`, `'name':`).
fn key_of(text: &str) -> Option<&str> {
    let (key, rest) = match text.chars().next()? {
        q @ ('"' | '\'') => {
            let end = text[1..].find(q)? + 1;
            (&text[1..end], &text[end + 1..])
        }
        _ => {
            let end = text.find(':')?;
            (&text[..end], &text[end..])
        }
    };
    let rest = rest.strip_prefix(':')?;
    (rest.is_empty() || rest.starts_with(' ')).then_some(key)
}

/// 1-based (line, column) of `field` in the document that starts at 1-based `doc_line` of a
/// file's `lines` (split once per file: a file may carry many problems). The cost is the
/// document's length per step of the path, never the whole file's.
pub fn locate(lines: &[&str], doc_line: usize, field: &str) -> Option<(usize, usize)> {
    let mut lo = doc_line.saturating_sub(1);
    if lines.get(lo).is_some_and(|l| l.starts_with("---")) {
        lo += 1;
    }
    let hi = (lo..lines.len()).find(|&i| lines[i].starts_with("---") || lines[i] == "...").unwrap_or(lines.len());
    // The block being searched: lines lo..hi whose content is deeper than `parent` (the column
    // of the key or item marker that owns them; -1 at the top).
    let (mut lo, mut hi, mut parent) = (lo, hi, -1isize);
    let mut found = None;
    for step in steps(field)? {
        match step {
            Step::Key(k) => {
                // The children's column: that of the first line with content deeper than `parent`.
                let Some(child) = (lo..hi).filter_map(|i| content(lines[i])).find(|c| c.col as isize > parent) else {
                    return found;
                };
                let col = child.col;
                let Some(i) =
                    (lo..hi).find(|&i| content(lines[i]).is_some_and(|c| c.col == col && key_of(c.text) == Some(k)))
                else {
                    return found;
                };
                found = Some((i + 1, col + 1));
                // Its value: the lines after it, up to one at the key's column that is not an item
                // of a list written at that column, or one less deep.
                let end = (i + 1..hi)
                    .find(|&j| {
                        content(lines[j]).is_some_and(|c| {
                            let at = c.dash.unwrap_or(c.col);
                            at < col || (at == col && c.dash.is_none())
                        })
                    })
                    .unwrap_or(hi);
                (lo, hi, parent) = (i + 1, end, col as isize - 1);
            }
            Step::Index(n) => {
                let dashes: Vec<(usize, usize)> = (lo..hi)
                    .filter_map(|i| content(lines[i]).and_then(|c| c.dash.map(|d| (i, d))))
                    .filter(|(_, d)| *d as isize > parent)
                    .collect();
                let Some(&(_, first)) = dashes.first() else { return found };
                let items: Vec<usize> = dashes.iter().filter(|(_, d)| *d == first).map(|(i, _)| *i).collect();
                let Some(&i) = items.get(n) else { return found };
                found = Some((i + 1, first + 1));
                let end = items.get(n + 1).copied().unwrap_or(hi);
                (lo, hi, parent) = (i, end, first as isize);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locate(text: &str, doc_line: usize, field: &str) -> Option<(usize, usize)> {
        super::locate(&text.lines().collect::<Vec<_>>(), doc_line, field)
    }

    const FLEET: &str = "\
# a comment
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata:
  name: eu
spec:
  region: eu-central-1
  pools:
  - name: h100
    class: h100
    maxNodes: 4
  - name: l40s
    class: l40s
    maxNodes: -1
---
kind: ModelDeployment
spec:
  devices:
    alternatives:
      - class: h200
      - selectors:
          - device.x == 1
          - device.y == 2
  placement: {clusterSelector: {matchLabels: {a: b}}}
";

    #[test]
    fn fields_of_block_yaml_are_found_by_key_and_item() {
        assert_eq!(locate(FLEET, 1, "spec.region"), Some((7, 3)));
        assert_eq!(locate(FLEET, 1, "spec.pools[1].maxNodes"), Some((14, 5)));
        assert_eq!(locate(FLEET, 1, "spec.pools[0].name"), Some((9, 5)));
        assert_eq!(locate(FLEET, 1, "spec.pools[1]"), Some((12, 3)));
        assert_eq!(locate(FLEET, 1, "metadata.name"), Some((5, 3)));
        // The second document, its list items indented under their key.
        assert_eq!(locate(FLEET, 15, "spec.devices.alternatives[1].selectors[1]"), Some((23, 11)));
        assert_eq!(locate(FLEET, 15, "spec.devices.alternatives[0].class"), Some((20, 9)));
    }

    #[test]
    fn flow_style_gives_the_deepest_line_found_and_a_missing_field_none() {
        // `clusterSelector` is inside a flow mapping: the `placement` line.
        assert_eq!(locate(FLEET, 15, "spec.placement.clusterSelector.matchLabels"), Some((24, 3)));
        assert_eq!(locate(FLEET, 1, "spec.nothing"), Some((6, 1)), "its parent");
        assert_eq!(locate(FLEET, 1, "nothing"), None);
        // A key of the other document is not found in this one.
        assert_eq!(locate(FLEET, 1, "spec.devices"), Some((6, 1)));
    }

    #[test]
    fn paths_are_read_with_their_indexes() {
        assert_eq!(
            steps("spec.a[1].b[0][2]").unwrap(),
            vec![Step::Key("spec"), Step::Key("a"), Step::Index(1), Step::Key("b"), Step::Index(0), Step::Index(2)]
        );
        assert!(steps("spec.a[x]").is_none());
    }
}
