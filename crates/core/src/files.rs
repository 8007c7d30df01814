//! Reading the files a spec or plan names (a plan's `[[found]]` families, an adapter's
//! exports and their manifests), which may be anything a path can name: only a regular
//! file is read, it is opened without blocking (a FIFO with no writer would otherwise
//! hang the reader past every signal), its size is checked against a limit before a
//! byte is read, and a file hashed for a pin is hashed as a stream, never held whole.
//!
//! Not for configuration files (specs, plans: `input::read_config`) nor for a run's own
//! files (the store's).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use anyhow::Context;
use sha2::{Digest, Sha256};

/// The largest `found-family.json` a plan may name: a family is a few templates of at
/// most 2,000 characters each, kilobytes in all.
pub(crate) const MAX_FOUND_FAMILY_BYTES: u64 = 1 << 20;

/// The largest export manifest read: it lists the source runs and counts families.
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Opens `path` for reading if it is a regular file (a link to one is followed), and
/// says what it is otherwise. `O_NONBLOCK` keeps the open of a FIFO from waiting for a
/// writer; on a regular file it changes nothing.
pub fn open_regular(path: &Path) -> anyhow::Result<(File, u64)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
        .with_context(|| format!("{}: cannot open it", path.display()))?;
    let meta = file.metadata().with_context(|| format!("{}: cannot read its metadata", path.display()))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a folder"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a plain file"
        };
        anyhow::bail!("{}: is {what}, not a regular file", path.display());
    }
    Ok((file, meta.len()))
}

/// The whole of a regular file of at most `limit` bytes; `what` names it in the error
/// of one over the limit (the limit is said).
pub fn read_regular(path: &Path, limit: u64, what: &str) -> anyhow::Result<Vec<u8>> {
    let (file, size) = open_regular(path)?;
    let over =
        |size: u64| anyhow::anyhow!("{}: {size} bytes, over the limit of {} for {what}", path.display(), bytes(limit));
    if size > limit {
        return Err(over(size));
    }
    let mut contents = Vec::with_capacity(size as usize);
    // A file that grows while read stops at the limit, not at the end of the disk.
    file.take(limit + 1).read_to_end(&mut contents).with_context(|| format!("{}: reading it", path.display()))?;
    if contents.len() as u64 > limit {
        return Err(over(contents.len() as u64));
    }
    Ok(contents)
}

/// The sha256 (hex) of a regular file, read in blocks: an export may be gigabytes.
pub fn sha256_regular(path: &Path) -> anyhow::Result<String> {
    let (mut file, _) = open_regular(path)?;
    let mut hasher = Sha256::new();
    let mut block = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut block).with_context(|| format!("{}: reading it", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&block[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// A limit in words: `1 MiB`.
fn bytes(limit: u64) -> String {
    match limit {
        l if l >= 1 << 20 && l % (1 << 20) == 0 => format!("{} MiB", l >> 20),
        l if l >= 1 << 10 && l % (1 << 10) == 0 => format!("{} KiB", l >> 10),
        l => format!("{l} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_a_device_and_a_folder_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
        let err = read_regular(&fifo, 10, "a test file").unwrap_err().to_string();
        assert!(err.contains("is a FIFO") && err.contains("fifo"), "{err}");
        let err = sha256_regular(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(err.contains("/dev/zero: is a device"), "{err}");
        let err = read_regular(dir.path(), 10, "a test file").unwrap_err().to_string();
        assert!(err.contains("is a folder"), "{err}");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_the_limit_and_one_under_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.json");
        std::fs::write(&file, vec![b'x'; 2048]).unwrap();
        let err = read_regular(&file, 1024, "a found family").unwrap_err().to_string();
        assert!(err.contains("2048 bytes, over the limit of 1 KiB for a found family"), "{err}");
        assert_eq!(read_regular(&file, 4096, "a found family").unwrap().len(), 2048);
        assert_eq!(sha256_regular(&file).unwrap(), crate::util::sha256_hex(&[b'x'; 2048]));
    }
}
