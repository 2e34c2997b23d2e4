#!/usr/bin/env bash
# vendor/ holds two CubeCL crates with qdarts' changes (vendor/README.md says which and why).
# Each is the crate as crates.io publishes it plus one patch, vendor/patches/<crate>.patch:
#
#   bash scripts/vendor.sh           rebuild vendor/<crate> from the published crate and its patch
#   bash scripts/vendor.sh --check   rebuild into a scratch folder and compare with vendor/ (CI):
#                                    exit 1, with the difference, where they disagree
#   bash scripts/vendor.sh --diff    write vendor/patches/ from vendor/ as it stands (after an
#                                    edit there)
#
# The crates come from ~/.cargo/registry/cache when cargo has them, else from crates.io's
# download host (a package registry), checked against the SHA-256 sums below either way.
set -euo pipefail
cd "$(dirname "$0")/.."

# name, version, SHA-256 of the .crate file crates.io serves.
crates=(
    "cubecl-cuda 0.11.3 dacd0c047f781b468d094705ef042f28d68944bf862c049f5cf0b7396f730bb5"
    "cubecl-server 0.11.3 1c3c53dc26bfab898ed67ee32af21e600f9fb438e77b48e949f1258f0af634b4"
)
# Files of a published crate that are packaging, not source; vendor/ leaves them out.
packaging=(Cargo.toml.orig .cargo_vcs_info.json Cargo.lock .cargo-ok)

mode="${1:-rebuild}"
case "$mode" in
    rebuild | --check | --diff) ;;
    *)
        echo "usage: bash scripts/vendor.sh [--check | --diff]" >&2
        exit 2
        ;;
esac

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# The verified .crate file of `name` `version`, downloaded when cargo's cache lacks it.
crate_file() {
    local name="$1" version="$2" sum="$3" file
    file="$(ls "$HOME"/.cargo/registry/cache/*/"$name-$version.crate" 2>/dev/null | head -n 1 || true)"
    if [ -z "$file" ]; then
        command -v curl >/dev/null || { echo "vendor: curl is needed to download $name $version" >&2; exit 1; }
        file="$scratch/$name-$version.crate"
        curl -sSfL --retry 3 -o "$file" \
            "https://static.crates.io/crates/$name/$name-$version.crate" || {
            echo "vendor: could not download $name $version from static.crates.io" >&2
            exit 1
        }
    fi
    if [ "$(sha256sum "$file" | cut -d' ' -f1)" != "$sum" ]; then
        echo "vendor: $file is not $name $version as published (SHA-256 differs)" >&2
        exit 1
    fi
    echo "$file"
}

# Unpacks `name` `version` into `dest` (a folder that must not exist), packaging left out.
pristine() {
    local name="$1" version="$2" sum="$3" dest="$4" file
    file="$(crate_file "$name" "$version" "$sum")"
    mkdir -p "$scratch/unpack"
    tar -xzf "$file" -C "$scratch/unpack"
    mv "$scratch/unpack/$name-$version" "$dest"
    for f in "${packaging[@]}"; do
        rm -f "$dest/$f"
    done
}

status=0
for entry in "${crates[@]}"; do
    read -r name version sum <<<"$entry"
    patch_file="$PWD/vendor/patches/$name.patch"
    pristine "$name" "$version" "$sum" "$scratch/a"
    case "$mode" in
        --diff)
            mkdir -p vendor/patches
            cp -R "vendor/$name" "$scratch/b"
            for f in "${packaging[@]}"; do
                rm -f "$scratch/b/$f"
            done
            # diff exits 1 when the trees differ, which is the point; the file times are
            # dropped so that a patch changes only where the source does.
            (cd "$scratch" && diff -ruN a b >"$scratch/raw.patch") || [ $? -eq 1 ]
            sed -E 's/^((---|\+\+\+) [^\t]+)\t.*$/\1/' "$scratch/raw.patch" >"$patch_file"
            echo "vendor/patches/$name.patch: $(grep -c '^+++ ' "$patch_file") files changed"
            ;;
        rebuild | --check)
            (cd "$scratch/a" && git apply -p1 "$patch_file") || {
                echo "vendor: vendor/patches/$name.patch does not apply to $name $version" >&2
                exit 1
            }
            if [ "$mode" = rebuild ]; then
                rm -rf "vendor/$name"
                cp -R "$scratch/a" "vendor/$name"
                echo "vendor/$name: $name $version with vendor/patches/$name.patch"
            elif diff -r "$scratch/a" "vendor/$name" >"$scratch/check.diff"; then
                echo "vendor/$name: $name $version with its patch, as committed"
            else
                echo "vendor/$name differs from $name $version with vendor/patches/$name.patch:" >&2
                cat "$scratch/check.diff" >&2
                echo "(after editing vendor/, run bash scripts/vendor.sh --diff)" >&2
                status=1
            fi
            ;;
    esac
    rm -rf "$scratch/a" "$scratch/b" "$scratch/unpack"
done
exit "$status"
