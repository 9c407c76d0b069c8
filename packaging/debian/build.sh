#!/bin/sh
# Build tpuwatch_VERSION_all.deb from this checkout, offline, into OUTDIR
# (default: dist/ at the repository root); prints the .deb's path.
# Needs: apt-get install debhelper dh-python python3-all dpkg-dev
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "${1:-$root/dist}")
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/tpuwatch/__init__.py")
changelog=$(dpkg-parsechangelog -l "$root/packaging/debian/changelog" -S Version)
if [ "$version" != "$changelog" ]; then
	echo "build.sh: tpuwatch/__init__.py says $version but packaging/debian/changelog says $changelog" >&2
	exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src="$work/tpuwatch-$version"
mkdir "$src"
tar -C "$root" --exclude=__pycache__ -c tpuwatch packaging/config.example.yaml docs | tar -C "$src" -x
tar -C "$root/packaging" --exclude=build.sh -c debian | tar -C "$src" -x
for name in service sysusers tmpfiles; do
	cp "$root/systemd/tpuwatch.$name" "$src/debian/tpuwatch.$name"
done
(cd "$src" && dpkg-buildpackage --build=binary --no-sign >"$work/build.log" 2>&1) || {
	cat "$work/build.log" >&2
	exit 1
}
mkdir -p "$out"
deb="tpuwatch_${version}_all.deb"
mv "$work/$deb" "$out/"
echo "$out/$deb"
