//! Reading what people write, and saying exactly where it is wrong: configuration files
//! (refused over a size limit; TOML errors as `file:line:col: message`; numbers held to
//! their bounds), the names of versions and plans on the command line (a name in its
//! folder or a path, names that cannot climb out of a folder, "did you mean" for a
//! typo). Every bad-input error of pruefstand is made here or from here.

use std::path::{Path, PathBuf};

use anyhow::anyhow;

/// 1-based line and column of a byte offset in a text.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before.len(), |nl| before.len() - nl - 1) + 1;
    (line, col)
}

/// Parses TOML into `T`, turning any error into `file:line:col: message` — the form
/// every bad-input error of pruefstand takes.
pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> anyhow::Result<T> {
    toml::from_str(text).map_err(|err| {
        let message = err.message().trim().to_string();
        match err.span() {
            Some(span) => at(path, text, span.start, &message),
            None => anyhow::anyhow!("{}: {message}", path.display()),
        }
    })
}

/// A number read from a file, refused unless finite and within `[low, high]` (or
/// `(low, high]` when `low_open`): the `deserialize_with` helpers of the settings
/// build on it, so a bad value is reported at its file:line:col with its field.
pub fn bounded<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
    field: &str,
    (low, high, low_open): (f64, f64, bool),
    unit: &str,
) -> Result<f64, D::Error> {
    let value = <f64 as serde::Deserialize>::deserialize(deserializer)?;
    let above_low = if low_open { value > low } else { value >= low };
    if value.is_finite() && above_low && value <= high {
        return Ok(value);
    }
    let open = if low_open { "(" } else { "[" };
    let shown = readable_number(value);
    Err(serde::de::Error::custom(format!("{field} = {shown} is not {unit} in {open}{low}, {high}]")))
}

/// A number as people read it in an error: 1e300 and 1e-300 in exponent form, not as
/// three hundred digits.
pub fn readable_number(value: f64) -> String {
    let a = value.abs();
    if value.is_finite() && a != 0.0 && !(1e-4..1e9).contains(&a) { format!("{value:e}") } else { value.to_string() }
}

/// A count read from a file, refused unless within `[low, high]` (see [`bounded`]).
pub(crate) fn bounded_count<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
    field: &str,
    (low, high): (usize, usize),
) -> Result<usize, D::Error> {
    let value = <usize as serde::Deserialize>::deserialize(deserializer)?;
    if (low..=high).contains(&value) {
        return Ok(value);
    }
    Err(serde::de::Error::custom(format!("{field} = {value} is not in [{low}, {high}]")))
}

/// The most a spec, plan or `pruefstand.toml` may hold: a hand-written file is a few
/// kilobytes; a larger one is refused before it is read into memory.
pub(crate) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A configuration file's text, refused as "too large" (with the limit) when over
/// [`MAX_CONFIG_BYTES`]: an error of kind `FileTooLarge`, so callers can tell it from a
/// missing file.
pub fn read_config(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        let size = std::fs::metadata(path).map_or(text.len() as u64, |m| m.len());
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "too large: {} bytes, the limit is {} KiB (a hand-written file needs a few)",
                size,
                MAX_CONFIG_BYTES >> 10
            ),
        ));
    }
    Ok(text)
}

/// A word someone typed, for a message: quoted, and cut to 80 characters with `…` (a
/// 10,000-character name echoed whole would bury the message).
pub fn quoted(word: &str) -> String {
    format!("{:?}", crate::util::cut(word, 80))
}

/// A path someone gave, for a message: cut to 160 characters with `…`.
pub(crate) fn shown_path(path: &Path) -> String {
    crate::util::cut(&path.display().to_string(), 160)
}

/// A command-line word naming a configuration file of some kind (a version, a plan):
/// a name, looked up in the root's folder for that kind, or — only when it looks like
/// one, containing `/` or ending in `.toml` — a path, relative to the working directory.
/// Messages say which it was taken as.
pub(crate) struct Named<'a> {
    pub kind: &'static str,
    pub word: &'a str,
    pub dir: &'a Path,
    pub path: PathBuf,
}

impl<'a> Named<'a> {
    pub fn new(kind: &'static str, word: &'a str, dir: &'a Path) -> Named<'a> {
        let path = if Named::is_path(word) { PathBuf::from(word) } else { dir.join(format!("{word}.toml")) };
        Named { kind, word, dir, path }
    }

    /// Whether `word` is taken as a path rather than a name.
    pub(crate) fn is_path(word: &str) -> bool {
        word.contains('/') || word.ends_with(".toml")
    }

    /// What was used, for a message: the name in its folder, or the file given.
    pub fn describe(&self) -> String {
        if Named::is_path(self.word) {
            format!("{} file {} (given as a path)", self.kind, shown_path(&self.path))
        } else {
            format!("{} {} from {}", self.kind, quoted(self.word), self.dir.display())
        }
    }

    /// The file's text (limited as [`read_config`] limits it); an error says what was
    /// looked for where: the folder's names for a missing name, the working directory
    /// for a missing path, "too large" and the limit for a file over it.
    pub fn read(&self) -> anyhow::Result<String> {
        match read_config(&self.path) {
            Ok(text) => Ok(text),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(anyhow!(self.missing())),
            Err(err) => Err(anyhow!("{}: {err}", self.describe())),
        }
    }

    fn missing(&self) -> String {
        if Named::is_path(self.word) {
            let cwd = std::env::current_dir().map_or_else(|_| "?".into(), |d| d.display().to_string());
            let relative = if self.path.is_relative() { format!(", relative to {cwd}") } else { String::new() };
            format!(
                "no {} file {}: {} was taken as a path (it contains '/' or ends in .toml){relative}; \
                 a {} name is looked up in {}",
                self.kind,
                shown_path(&self.path),
                quoted(self.word),
                self.kind,
                self.dir.display()
            )
        } else {
            unknown_name(self.kind, self.word, self.dir).unwrap_or_else(|| {
                format!("no {} {} in {} (it has no .toml files)", self.kind, quoted(self.word), self.dir.display())
            })
        }
    }
}

/// A name that becomes a path component (a version, a plan, a gym run): letters,
/// digits, `.`, `_`, `-`, not starting with `.` — so it can never climb out of the
/// folder it names. Err: why not.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a name cannot be empty".into());
    }
    if name.starts_with('.') {
        return Err(format!("{} starts with '.'", quoted(name)));
    }
    if name.len() > 100 {
        return Err(format!("{} is longer than 100 characters", quoted(name)));
    }
    match name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        Some(c) => Err(format!("{} holds {c:?}: use letters, digits, '.', '_' and '-'", quoted(name))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod name_tests {
    use super::check_name;

    #[test]
    fn names_cannot_climb_or_hide() {
        for good in ["demo-kandidat", "v1.2_x", "A"] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for bad in ["", "..", ".hidden", "../x", "a/b", "a b", "ü", "x\0"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}

/// Where `key = …` stands inside the table `[table]` (header spelled with or without
/// quotes and spaces), as a byte offset; None when it is not written there.
pub fn table_key_offset(text: &str, table: &str, key: &str) -> Option<usize> {
    let normal = |header: &str| header.chars().filter(|c| !c.is_whitespace() && *c != '"').collect::<String>();
    let wanted = normal(&format!("[{table}]"));
    let mut inside = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            inside = normal(trimmed.split('#').next().unwrap_or("")) == wanted;
        } else if inside
            && let Some(rest) = trimmed.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            return Some(offset + (line.len() - trimmed.len()));
        }
        offset += line.len();
    }
    None
}

/// An error located in a file: `file:line:col: message`.
pub fn at(path: &Path, text: &str, offset: usize, message: &str) -> anyhow::Error {
    let (line, col) = line_col(text, offset);
    anyhow::anyhow!("{}:{line}:{col}: {message}", path.display())
}

#[cfg(test)]
mod position_tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn toml_errors_name_file_line_and_field() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct T {
            a: u32,
        }
        let err = parse_toml::<T>(Path::new("x.toml"), "a = 1\nb = 2\n").unwrap_err().to_string();
        assert!(err.starts_with("x.toml:2:1: unknown field `b`"), "{err}");
    }
}

/// What to say when `name` names no `<name>.toml` in `dir`: the names there, and the
/// closest one ("did you mean") when it is a likely typo. `None` when `dir` holds no
/// `.toml` at all (then there is nothing to offer).
pub(crate) fn unknown_name(kind: &str, name: &str, dir: &Path) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.strip_suffix(".toml").map(str::to_string))
        .collect();
    names.sort();
    if names.is_empty() {
        return None;
    }
    let guess = closest(name, &names).map_or(".".to_string(), |g| format!("; did you mean {g:?}?"));
    Some(format!("no {kind} {} in {}{guess} There are: {}", quoted(name), dir.display(), names.join(", ")))
}

/// The candidate nearest to `typed` by edit distance, if it is near enough to be a typo
/// (at most a third of the longer name, and two edits allowed in any case).
pub fn closest<'a>(typed: &str, candidates: &'a [String]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(typed, c), c))
        .filter(|(d, c)| *d <= (typed.chars().count().max(c.chars().count()) / 3).max(2))
        .min()
        .map(|(_, c)| c.as_str())
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod typo_tests {
    use super::*;

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("schnel", "schnell"), 1);
        assert_eq!(edit_distance("kandidat", "kandiadt"), 2);
        assert_eq!(edit_distance("voll", "voll"), 0);
    }

    #[test]
    fn a_typo_gets_the_closest_name_and_the_list() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["demo-kandidat.toml", "demo-baseline.toml", "notes.txt"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let message = unknown_name("version", "demo-kandidt", dir.path()).unwrap();
        assert!(message.contains("did you mean \"demo-kandidat\"?"), "{message}");
        assert!(message.ends_with("There are: demo-baseline, demo-kandidat"), "{message}");
        let far = unknown_name("version", "xyz", dir.path()).unwrap();
        assert!(far.contains("\"xyz\" in ") && far.contains(". There are: "), "{far}");
        assert!(!far.contains("did you mean"), "{far}");
        assert_eq!(unknown_name("plan", "x", &dir.path().join("nowhere")), None);
    }
}
