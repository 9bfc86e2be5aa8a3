//! The README's first run: the command between its first-run markers, run
//! here, prints the table the README shows (the same rows and columns; the
//! numbers depend on timing), and its fault count is within the page
//! arithmetic the README states (dd's buffer: one fault per page, written
//! by read(2), plus dd's own start-up).

use super::*;
use faultscope::report::text::shape;

const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
const BEGIN: &str = "<!-- first-run:begin -->";
const END: &str = "<!-- first-run:end -->";
const PROMPT: &str = "$ sudo faultscope ";
/// dd's own faults besides its buffer (its binary, libc, stack): 77 on
/// the test host.
const START_UP: u64 = 4 * TOLERANCE;

/// The README's first run: faultscope's arguments (the command line after
/// `sudo faultscope`) and the output pasted below it.
fn first_run() -> (Vec<String>, String) {
    let text = std::fs::read_to_string(README).unwrap_or_else(|e| panic!("{README}: {e}"));
    let start = text.find(BEGIN).unwrap_or_else(|| panic!("no {BEGIN} in {README}")) + BEGIN.len();
    let end = start + text[start..].find(END).unwrap_or_else(|| panic!("no {END} after {BEGIN}"));
    let mut lines = text[start..end].lines().skip_while(|l| !l.starts_with("```"));
    assert!(lines.next().is_some(), "no fenced block between the first-run markers");
    let block: Vec<&str> = lines.take_while(|l| !l.starts_with("```")).collect();
    let command = block.first().and_then(|l| l.strip_prefix(PROMPT));
    let command = command.unwrap_or_else(|| panic!("the block's first line is not `{PROMPT}...`: {block:?}"));
    (shell_words(command), block[1..].join("\n"))
}

/// `s` split as a POSIX shell splits words: blanks separate, 'single' and
/// "double" quotes group (a backslash in double quotes escapes `"`, `\`,
/// `$` and a backtick), a backslash outside quotes takes the next
/// character as it is. No expansions.
fn shell_words(s: &str) -> Vec<String> {
    let (mut words, mut word, mut in_word) = (Vec::new(), String::new(), false);
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                continue;
            }
            '\'' => loop {
                match chars.next() {
                    Some('\'') => break,
                    Some(c) => word.push(c),
                    None => panic!("unterminated ' in {s:?}"),
                }
            },
            '"' => loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                        Some(c) => {
                            word.push('\\');
                            word.push(c);
                        }
                        None => panic!("unterminated \" in {s:?}"),
                    },
                    Some(c) => word.push(c),
                    None => panic!("unterminated \" in {s:?}"),
                }
            },
            '\\' => word.extend(chars.next()),
            c => word.push(c),
        }
        in_word = true;
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The `faults` row of the last table (the whole run): its COUNT and
/// KERNEL columns (`None` where not measurable).
fn faults_row(report: &str) -> (u64, Option<u64>) {
    let header: Vec<&str> = report
        .lines()
        .rfind(|l| l.split_whitespace().next() == Some("CLASS"))
        .unwrap_or_else(|| panic!("no CLASS header in:\n{report}"))
        .split_whitespace()
        .collect();
    let row: Vec<&str> = report
        .lines()
        .rfind(|l| l.starts_with("  ") && l.split_whitespace().next() == Some("faults"))
        .unwrap_or_else(|| panic!("no faults row in:\n{report}"))
        .split_whitespace()
        .collect();
    let column = |name: &str| {
        let i = header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no {name} in {header:?}"));
        row.get(i).and_then(|v| v.replace(',', "").parse::<u64>().ok())
    };
    (column("COUNT").unwrap_or_else(|| panic!("faults has no count: {row:?}")), column("KERNEL"))
}

/// The pages of dd's buffer (`bs=SIZE`, times `count=N`): the faults
/// read(2) takes writing it.
fn dd_pages(argv: &[String]) -> u64 {
    let program = argv.iter().skip_while(|a| *a != "--").nth(1).map(String::as_str);
    assert_eq!(
        program,
        Some("dd"),
        "the README's first run is no longer dd ({argv:?}): give this test its page arithmetic"
    );
    let arg = |key: &str| argv.iter().find_map(|a| a.strip_prefix(key)).map(str::to_string);
    let bytes = |v: &str| {
        let (n, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
        let unit = match unit {
            "" | "c" => 1,
            "K" => 1 << 10,
            "M" => 1 << 20,
            "G" => 1 << 30,
            other => panic!("unit {other:?} of {v:?}"),
        };
        n.parse::<u64>().unwrap() * unit
    };
    let bs = bytes(&arg("bs=").expect("dd has bs="));
    let count = arg("count=").map_or(1, |c| c.parse::<u64>().unwrap());
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    bs * count / page
}

/// THP at `always` may back dd's buffer with 2M pages: one fault each.
fn thp_always() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]"))
}

#[test]
fn shell_words_split_as_a_shell_does() {
    let _t = host_test();
    let w = |s: &str| shell_words(s);
    assert_eq!(w("record -- dd  if=/dev/zero"), ["record", "--", "dd", "if=/dev/zero"]);
    assert_eq!(
        w("record -- sh -c 'head -c 64M /dev/zero >/dev/null'"),
        ["record", "--", "sh", "-c", "head -c 64M /dev/zero >/dev/null"]
    );
    assert_eq!(w(r#"a "b \"c\" \d" e\ f ''"#), ["a", r#"b "c" \d"#, "e f", ""]);
}

#[test]
fn the_readmes_first_run_prints_what_the_readme_shows() {
    let _t = host_test();
    let (argv, pasted) = first_run();
    assert_eq!(argv.first().map(String::as_str), Some("record"), "{argv:?}");
    let pages = dd_pages(&argv);

    let out = Command::new(bin()).args(&argv).output().expect("running faultscope");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("$ faultscope {}\n{stderr}{stdout}", argv.join(" "));
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);

    // The command has standard output: the tables are on standard error.
    let (want, got) = (shape(&pasted), shape(&stderr));
    assert!(want.len() > 3, "the README's output has no table: {want:?}");
    assert_eq!(got, want, "the run's rows and columns are not the README's");

    // The README's own figures are within the arithmetic it states, and
    // so are this run's.
    for (what, text) in [("README", &*pasted), ("this run", &*stderr)] {
        let (faults, kernel) = faults_row(text);
        if thp_always() && what == "this run" {
            eprintln!(
                "THP is at `always`: dd's buffer may take 2M pages; {faults} faults ({pages} 4K pages)"
            );
            continue;
        }
        assert!(
            (pages..=pages + START_UP).contains(&faults),
            "{what}: {faults} faults for a buffer of {pages} pages (+ at most {START_UP} of dd's own)"
        );
        if let Some(kernel) = kernel {
            assert!(
                (pages..=pages + TOLERANCE).contains(&kernel),
                "{what}: {kernel} kernel-origin faults, not read(2)'s {pages} pages"
            );
        }
    }
}
