# unpack.sh - sourced by the device scripts: if folder $BIN was packed by
# dev/gpu/pack.sh, unpack it to a temporary folder and point BIN there.
if [ -f "$BIN/pack.tar.xz" ]; then
  _unpacked=$(mktemp -d)
  xz -dc "$BIN/pack.tar.xz" | tar xf - -C "$_unpacked" && BIN=$_unpacked
fi
