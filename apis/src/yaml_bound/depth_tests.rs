use super::*;

fn at(text: &str) -> Option<(usize, usize)> {
    check(text).err().map(|e| (e.line, e.column))
}

#[test]
fn deep_flow_mappings_in_json_and_yaml_are_refused_where_they_pass_the_bound() {
    // `{"a":` is five bytes. The line is a block node (level 1), so the 64th `{` opens level
    // 65, at column 5 * 63 + 1.
    let json = format!("{}1{}", r#"{"a":"#.repeat(100_000), "}".repeat(100_000));
    assert_eq!(at(&json), Some((1, 5 * 63 + 1)));
    let yaml = format!("spec:\n  x: {}1{}\n", "{a: ".repeat(100_000), "}".repeat(100_000));
    assert_eq!(at(&yaml), Some((2, 6 + 4 * 62)));
    // Sequences too, and brackets spread over lines.
    let lines = "[\n".repeat(100);
    assert_eq!(at(&lines), Some((64, 1)));
}

#[test]
fn deep_block_nesting_is_refused_by_indentation_and_by_compact_indicators() {
    let mut nested = String::new();
    for level in 0..100 {
        nested.push_str(&format!("{}k{level}:\n", "  ".repeat(level)));
    }
    assert_eq!(at(&nested), Some((65, 129)));
    let compact = format!("{}x\n", "- ".repeat(1000));
    assert_eq!(at(&compact), Some((1, 129)));
    let keys = format!("{}x\n", "? ".repeat(1000));
    assert!(at(&keys).is_some());
}

#[test]
fn brackets_inside_strings_comments_and_block_scalars_do_not_nest() {
    let many = "[{".repeat(200);
    for text in [
        format!("a: \"{many}\"\n"),
        format!("a: '{many}'\n"),
        format!("a: '{many}''{many}'\n"),
        format!("a: \"\\\"{many}\"\n"),
        format!("a: 1 # {many}\n"),
        format!("# {many}\n"),
        format!("a: |\n  {many}\n  {many}\n\n  {many}\nb: 2\n"),
        format!("- >-\n   {many}\n- x\n"),
        format!("a: plain text with {many} inside\n"),
        format!("a: \"multi\n  line {many}\n  string\"\nb: 1\n"),
        format!("{{\"a\": \"{many}\", \"b\": ['{many}']}}\n"),
    ] {
        assert_eq!(at(&text), None, "{text}");
    }
}

#[test]
fn a_quote_inside_a_plain_scalar_does_not_hide_the_nesting_after_it() {
    // libyaml reads these quotes as characters of a plain scalar; a pass that took them for
    // strings would skip the brackets that follow.
    let deep = "[".repeat(100);
    for text in [
        format!("a: x'y\nb: {deep}\n"),
        format!("a: x\n  'y\nb: {deep}\n"),
        format!("{{a: x'y, b: {deep}\n"),
        format!("{{a: x\n 'y, b: {deep}\n"),
        format!("a: !t'x {deep}\n"),
        format!("- key: |\n  other: {deep}\n"),
    ] {
        assert!(at(&text).is_some(), "{text}");
    }
}

#[test]
fn every_example_crd_and_invalid_fixture_of_the_repository_is_within_the_bound() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut seen = 0;
    // The CRDs are the deepest YAML of the repository (about 20 levels).
    let mut stack = vec![root.join("examples"), root.join("tests/fixtures/invalid"), root.join("charts/flotilla/crds")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")) {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                assert_eq!(check(&text), Ok(()), "{}", path.display());
                seen += 1;
            }
        }
    }
    assert!(seen > 20, "{seen} files");
}

#[test]
fn the_bound_is_the_depth_not_the_length() {
    // Wide and long is fine: a million siblings.
    let wide = format!("[{}]\n", "[1],".repeat(250_000));
    assert_eq!(at(&wide), None);
    // Exactly at the bound passes; one more level does not.
    let exact = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
    assert_eq!(at(&exact), None);
    let over = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert_eq!(at(&over), Some((1, MAX_DEPTH)));
}
