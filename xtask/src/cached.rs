//! Builds cached by key: the kernels (`kbuild`) and the patched QEMU
//! (`qemu`). A build's result is a folder under this checkout's `parent`,
//! also shared under a machine-wide folder so that a fresh checkout finds
//! it; one build of a key runs at a time (a lock file), in a scratch
//! folder of its own, installed by rename so that a reader finds a build
//! whole or not at all.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, Result};

/// Where a build of `key` lives, and how to tell a finished one.
pub struct Cache<'a, T> {
    /// What is built, for messages (`xtask kernel`, `xtask qemu`).
    pub what: &'a str,
    pub key: &'a str,
    /// This checkout's builds.
    pub parent: PathBuf,
    /// The machine-wide folder of builds.
    pub machine: &'a Path,
    /// A finished build in a folder, or None.
    pub at: fn(PathBuf) -> Option<T>,
}

impl<T> Cache<'_, T> {
    fn local(&self) -> PathBuf {
        self.parent.join(self.key)
    }

    pub fn cached(&self) -> Option<T> {
        [self.local(), self.machine.join(self.key)].into_iter().find_map(self.at)
    }

    /// The build, cached or made now by `build(scratch)`, which leaves
    /// the result in `scratch/out` and its log in `scratch/build.log`
    /// (kept as `parent/failed-KEY.log` when it fails).
    pub fn get(&self, build: impl FnOnce(&Path) -> Result<()>) -> Result<T> {
        if let Some(b) = self.cached() {
            return Ok(b);
        }
        let (what, key) = (self.what, self.key);
        fs::create_dir_all(&self.parent)?;
        // One build of a key at a time: a second xtask waits for the
        // first's result instead of building it again.
        let lock = fs::File::create(self.parent.join(format!(".{key}.lock")))?;
        if lock.try_lock().is_err() {
            eprintln!("{what}: waiting for another build of {key}");
            lock.lock()?;
        }
        if let Some(b) = self.cached() {
            return Ok(b);
        }
        let t0 = Instant::now();
        // A build of this key that was killed left its scratch folder;
        // with the lock held, none is running.
        for e in fs::read_dir(&self.parent)?.flatten() {
            if e.file_name().to_string_lossy().starts_with(&format!(".{key}.build-")) {
                eprintln!("{what}: removing {}, left by a build that did not finish", e.path().display());
                fs::remove_dir_all(e.path())?;
            }
        }
        let scratch = self.parent.join(format!(".{key}.build-{}", std::process::id()));
        fs::create_dir_all(&scratch)?;
        if let Err(e) = build(&scratch) {
            let kept = self.parent.join(format!("failed-{key}.log"));
            let where_ = match fs::rename(scratch.join("build.log"), &kept) {
                Ok(()) => format!(" (log: {})", kept.display()),
                Err(_) => String::new(),
            };
            let _ = fs::remove_dir_all(&scratch);
            return Err(e.context(format!("{what}: building {key}{where_}")));
        }
        let local = self.local();
        self.install(&scratch.join("out"), &local)?;
        fs::remove_dir_all(&scratch)?;
        let built = (self.at)(local.clone()).context("the installed build is incomplete")?;
        if let Err(e) = self.share(&local, &self.machine.join(key)) {
            eprintln!("{what}: not shared in {} ({e:#})", self.machine.display());
        }
        eprintln!("{what}: built {key} in {:.0}s: {}", t0.elapsed().as_secs_f64(), local.display());
        Ok(built)
    }

    /// Renames `from` to `to`; if another build got there first, keeps that.
    fn install(&self, from: &Path, to: &Path) -> Result<()> {
        if let Err(e) = fs::rename(from, to) {
            if (self.at)(to.to_path_buf()).is_none() {
                return Err(e).with_context(|| format!("moving the build to {}", to.display()));
            }
        }
        Ok(())
    }

    /// Copies a finished build into the machine-wide folder, atomically.
    fn share(&self, from: &Path, to: &Path) -> Result<()> {
        if (self.at)(to.to_path_buf()).is_some() {
            return Ok(());
        }
        let parent = to.parent().context("no parent")?;
        fs::create_dir_all(parent)?;
        let name = to.file_name().context("no file name")?.to_string_lossy();
        let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
        fs::create_dir_all(&tmp)?;
        let copied = fs::read_dir(from)?
            .flatten()
            .try_for_each(|e| fs::copy(e.path(), tmp.join(e.file_name())).map(drop))
            .map_err(anyhow::Error::from)
            .and_then(|()| self.install(&tmp, to));
        let _ = fs::remove_dir_all(&tmp);
        copied
    }
}
