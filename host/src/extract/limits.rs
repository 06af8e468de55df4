//! The caps on what an image may make the runner do while extracting (docs/design.md#limits).

/// Size limits for what is extracted.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest single extracted file (bytes).
    pub max_file_size: u64,
    /// Largest sum of all extracted files (bytes).
    pub max_total_size: u64,
    /// Largest layer blob (bytes, compressed).
    pub max_blob_size: u64,
    /// Most layers an image may have (`--max-layers`).
    pub max_layers: usize,
    /// Most decompressed bytes per compressed byte of a layer (`--max-layer-ratio`).
    pub max_layer_ratio: u64,
    /// Absolute ceiling of one layer's decompressed bytes (`--max-layer-bytes`).
    pub max_layer_bytes: u64,
    /// Most tar entries indexed over all layers read (`--max-index-entries`).
    pub max_index_entries: u64,
    /// Most bytes the merged index may hold (`--max-index-bytes`).
    pub max_index_bytes: u64,
}

/// Default for `--max-layer-ratio`: most decompressed bytes per compressed byte of a layer.
pub const DEFAULT_MAX_RATIO: u64 = 256;
/// Decompressed bytes every layer may produce whatever its ratio (small layers: tar
/// padding and headers compress far beyond any ratio).
pub const RATIO_FLOOR: u64 = 64 << 20;
/// Default for `--max-layer-bytes`: absolute ceiling of one layer's decompressed bytes.
pub const DEFAULT_MAX_LAYER_BYTES: u64 = 32 << 30;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_size: 4 << 30,
            max_total_size: 8 << 30,
            max_blob_size: 16 << 30,
            max_layers: 256,
            max_layer_ratio: DEFAULT_MAX_RATIO,
            max_layer_bytes: DEFAULT_MAX_LAYER_BYTES,
            max_index_entries: 250_000,
            max_index_bytes: 24 << 20,
        }
    }
}

/// Most decompressed bytes a layer of `compressed` bytes may produce:
/// `min(max(ratio × compressed, RATIO_FLOOR), ceiling)`.
pub fn layer_cap(compressed: u64, ratio: u64, ceiling: u64) -> u64 {
    compressed.saturating_mul(ratio).max(RATIO_FLOOR).min(ceiling)
}
