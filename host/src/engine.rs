//! The process-wide wasmtime [`Engine`] and the compiled-component caches.
//!
//! Compiling a component with Cranelift takes seconds, so compiled components
//! are cached twice:
//! - in memory, for the life of the process, keyed by (canonical path, mtime,
//!   size): every host started in one test binary compiles each `.wasm` once;
//! - on disk, in the cache directory of the host's config (see [`crate::config`]),
//!   keyed by a SHA-256 of the Wasm bytes and a hash of the engine's
//!   compilation settings (which include the wasmtime version). Each file ends
//!   with a SHA-256 of its contents, checked before it is deserialized, and
//!   only files this module wrote (atomically, via rename) are read.
//!
//! The engine compiles in parallel and, where the OS allows, uses the pooling
//! instance allocator, which makes the per-request instantiation cheap. Its
//! epoch advances every [`EPOCH_TICK`], and each store yields to the runtime
//! at every tick ([`configure_store`]), so a guest busy computing cannot hold
//! a worker thread and starve other requests.
//!
//! With [`crate::HostConfig::perf_map`] (`SPIN_HOST_PROFILER=perfmap`) the engine writes
//! `/tmp/perf-<pid>.map`, so `perf report` names the guests' functions.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Where a component came from when the host loaded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadSource {
    /// Already compiled earlier in this process.
    Memory,
    /// Deserialized from the on-disk cache.
    Disk,
    /// Compiled now with Cranelift.
    Compiled,
}

/// How long loading one component took, and from where.
#[derive(Clone, Debug)]
pub struct ComponentLoad {
    pub component: String,
    pub path: PathBuf,
    pub source: LoadSource,
    pub elapsed: Duration,
}

/// How often running guests yield to the async runtime.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Makes a store's guest yield at every epoch tick.
pub fn configure_store<T>(store: &mut wasmtime::Store<T>) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_async_yield_and_update(1);
}

static ENGINE: OnceLock<Engine> = OnceLock::new();

/// The engine shared by every host in the process.
pub fn engine() -> &'static Engine {
    engine_with(false)
}

/// The engine shared by every host in the process; the first host to start makes it, with
/// or without a perf map.
pub fn engine_with(perf_map: bool) -> &'static Engine {
    ENGINE.get_or_init(|| {
        let engine = new_engine(perf_map);
        let ticker = engine.clone();
        std::thread::Builder::new()
            .name("spin-host-epoch".to_string())
            .spawn(move || {
                loop {
                    std::thread::sleep(EPOCH_TICK);
                    ticker.increment_epoch();
                }
            })
            .expect("start the epoch ticker thread");
        engine
    })
}

fn new_engine(perf_map: bool) -> Engine {
    let mut pooling = PoolingAllocationConfig::default();
    pooling.total_component_instances(1000);
    pooling.total_core_instances(4000);
    pooling.total_memories(2000);
    pooling.total_tables(2000);
    pooling.total_stacks(1000);
    pooling.max_memory_size(1 << 30);
    let mut config = base_config(perf_map);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
    match Engine::new(&config) {
        Ok(engine) => engine,
        // E.g. a small virtual-memory limit: fall back to on-demand allocation.
        Err(_) => {
            Engine::new(&base_config(perf_map)).expect("wasmtime engine with default settings")
        }
    }
}

fn base_config(perf_map: bool) -> Config {
    let mut config = Config::new();
    config.parallel_compilation(true);
    config.wasm_backtrace_details(wasmtime::WasmBacktraceDetails::Enable);
    config.epoch_interruption(true);
    if perf_map {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    config
}

type MemoryKey = (PathBuf, SystemTime, u64);
/// One compiled component, filled in by whoever compiles it first.
type Slot = Arc<Mutex<Option<Component>>>;

fn memory_cache() -> &'static Mutex<HashMap<MemoryKey, Slot>> {
    static CACHE: OnceLock<Mutex<HashMap<MemoryKey, Slot>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Loads a compiled component, from memory, disk or Cranelift.
pub fn load_component(
    path: &Path,
    disk_cache: Option<&Path>,
) -> anyhow::Result<(Component, LoadSource)> {
    let canonical = path
        .canonicalize()
        .with_context(|| format!("cannot read {}", path.display()))?;
    let meta =
        std::fs::metadata(&canonical).with_context(|| format!("cannot read {}", path.display()))?;
    let key = (
        canonical.clone(),
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        meta.len(),
    );
    let slot = memory_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(key)
        .or_default()
        .clone();
    // One compilation per key; others wait for it and share the result.
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(component) = slot.as_ref() {
        return Ok((component.clone(), LoadSource::Memory));
    }
    let bytes =
        std::fs::read(&canonical).with_context(|| format!("cannot read {}", path.display()))?;
    let (component, source) = load_uncached(&canonical, &bytes, disk_cache)?;
    *slot = Some(component.clone());
    Ok((component, source))
}

fn load_uncached(
    path: &Path,
    wasm: &[u8],
    disk_cache: Option<&Path>,
) -> anyhow::Result<(Component, LoadSource)> {
    let engine = engine();
    let cache_file = disk_cache.map(|dir| dir.join(cache_file_name(path, wasm)));
    if let Some(file) = &cache_file
        && let Some(component) = read_cached(engine, file)
    {
        return Ok((component, LoadSource::Disk));
    }
    let component = Component::from_binary(engine, wasm)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("cannot compile {} as a Wasm component", path.display()))?;
    if let Some(file) = &cache_file {
        // The cache is an optimisation: failing to write it is not an error.
        let _ = write_cached(&component, file, path);
    }
    Ok((component, LoadSource::Compiled))
}

fn engine_hash(engine: &Engine) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.finish()
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| {
            s.to_string_lossy()
                .replace(|c: char| !c.is_ascii_alphanumeric() && c != '_', "-")
        })
        .unwrap_or_else(|| "component".to_string())
}

fn cache_file_name(path: &Path, wasm: &[u8]) -> String {
    let digest = hex::encode(Sha256::digest(wasm));
    format!(
        "{}-{}-{:016x}.cwasm",
        stem(path),
        &digest[..32],
        engine_hash(engine())
    )
}

fn read_cached(engine: &Engine, file: &Path) -> Option<Component> {
    let data = std::fs::read(file).ok()?;
    if data.len() < 32 {
        return None;
    }
    let (body, checksum) = data.split_at(data.len() - 32);
    if Sha256::digest(body).as_slice() != checksum {
        return None;
    }
    // SAFETY: the file was written by `write_cached` (it carries our checksum
    // over exactly these bytes), from `Component::serialize` of an engine with
    // the same compatibility hash, which is part of the file name; wasmtime
    // checks that hash again while deserializing.
    unsafe { Component::deserialize(engine, body) }.ok()
}

fn write_cached(component: &Component, file: &Path, source: &Path) -> anyhow::Result<()> {
    let dir = file.parent().context("cache file has no directory")?;
    std::fs::create_dir_all(dir)?;
    let mut data = component.serialize().map_err(anyhow::Error::from)?;
    let checksum = Sha256::digest(&data);
    data.extend_from_slice(&checksum);
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        file.file_name().and_then(|n| n.to_str()).unwrap_or("cwasm"),
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, file)?;
    prune_stale(dir, file, source);
    Ok(())
}

/// Removes older artifacts of the same component for the same engine.
fn prune_stale(dir: &Path, keep: &Path, source: &Path) {
    let prefix = format!("{}-", stem(source));
    let suffix = format!("-{:016x}.cwasm", engine_hash(engine()));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // `<stem>-<32 hex>-<16 hex>.cwasm` exactly, so `probe-x-...` is not `probe-...`'s.
        let is_same = name.starts_with(&prefix)
            && name.ends_with(&suffix)
            && name.len() == prefix.len() + 32 + suffix.len();
        if is_same && entry.path() != keep {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Times a load for reporting.
pub(crate) fn timed_load(
    component: &str,
    path: &Path,
    disk_cache: Option<&Path>,
) -> anyhow::Result<(Component, ComponentLoad)> {
    let start = Instant::now();
    let (c, source) = load_component(path, disk_cache)?;
    Ok((
        c,
        ComponentLoad {
            component: component.to_string(),
            path: path.to_path_buf(),
            source,
            elapsed: start.elapsed(),
        },
    ))
}
