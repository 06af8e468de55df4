//! The facts of the WIT types (`wit/kata-addons.wit`), written once for both halves: the
//! names of its enums, each provider's layout, and the dm-verity parameters' one parser.
//!
//! Each half generates its own Rust types from the WIT (wit-bindgen in the guest, wasmtime's
//! `bindgen!` in the runner), and neither generator gives an enum's WIT names to Rust code.
//! [`wit_facts!`] gives them, by exhaustive matches expanded in each half over that half's
//! generated types: a variant added to the WIT fails to compile on both sides until it is
//! named here. A provider's name is its [`ProviderLayout::name`](crate::ProviderLayout).

/// Implements, for the WIT types generated in the calling module (`ViolationCode`,
/// `ArtifactKind`, `Provider`, `Filesystem` and `VerityParams` in scope): `ALL` (WIT order),
/// `wit_name`, `from_wit_name` and `Display` (the WIT name) on the enums,
/// `Provider::layout`, and the conversions of `VerityParams` from and to the shared
/// parser's form ([`crate::verity::VerityParams`], whose `Display` is Kata's text).
#[macro_export]
macro_rules! wit_facts {
    () => {
        $crate::wit_enum!(ViolationCode {
            Missing => "missing",
            UnknownKey => "unknown-key",
            InvalidReference => "invalid-reference",
            InvalidPath => "invalid-path",
            InvalidVersion => "invalid-version",
            InvalidProvider => "invalid-provider",
            InvalidSha256 => "invalid-sha256",
            NotAllowed => "not-allowed",
            Conflict => "conflict",
            Inconsistent => "inconsistent",
            InvalidVerity => "invalid-verity",
            InvalidName => "invalid-name",
            NodeRefuses => "node-refuses",
        });
        // Also the installed file's name.
        $crate::wit_enum!(ArtifactKind {
            Kernel => "kernel",
            Initrd => "initrd",
            Image => "image",
            Extension => "extension",
        });
        // Also Kata's `rootfs_type` value.
        $crate::wit_enum!(Filesystem { Ext4 => "ext4", Xfs => "xfs", Erofs => "erofs" });
        $crate::wit_enum!(Provider {
            Se => $crate::layout::SE.name,
            Tdx => $crate::layout::TDX.name,
            Snp => $crate::layout::SNP.name,
        });

        impl Provider {
            /// Where the provider's runtime configurations live, and how one is recognised.
            pub fn layout(self) -> &'static $crate::ProviderLayout {
                match self {
                    Provider::Se => &$crate::layout::SE,
                    Provider::Tdx => &$crate::layout::TDX,
                    Provider::Snp => &$crate::layout::SNP,
                }
            }
        }

        impl ::core::convert::From<$crate::verity::VerityParams> for VerityParams {
            fn from(p: $crate::verity::VerityParams) -> VerityParams {
                let $crate::verity::VerityParams { root_hash, salt, data_blocks, data_block_size, hash_block_size } = p;
                VerityParams { root_hash, salt, data_blocks, data_block_size, hash_block_size }
            }
        }

        impl VerityParams {
            /// The shared parser's form (its `Display` is Kata's `kernel_verity_params` text).
            pub fn to_facts(&self) -> $crate::verity::VerityParams {
                let VerityParams { root_hash, salt, data_blocks, data_block_size, hash_block_size } = self.clone();
                $crate::verity::VerityParams { root_hash, salt, data_blocks, data_block_size, hash_block_size }
            }
        }

        /// Kata's `kernel_verity_params` text.
        impl ::core::fmt::Display for VerityParams {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                ::core::fmt::Display::fmt(&self.to_facts(), f)
            }
        }
    };
}

/// One enum of [`wit_facts!`].
#[doc(hidden)]
#[macro_export]
macro_rules! wit_enum {
    ($ty:ident { $($variant:ident => $name:expr),+ $(,)? }) => {
        impl $ty {
            /// Every value, in WIT order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The WIT name.
            pub fn wit_name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }

            /// The value whose WIT name is `name` (exact).
            pub fn from_wit_name(name: &str) -> Option<$ty> {
                $ty::ALL.iter().copied().find(|v| v.wit_name() == name)
            }
        }

        impl ::core::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.pad(self.wit_name())
            }
        }
    };
}
