#!/bin/bash
# Shared identities, side by side for two builds of forkd (say, before and after bases):
# a Debian sandbox after 3,000 writes in 100 directories, and a live branch of it after
# 1,000 more, each checked with fixtures/identity/check.sh (a walk of the whole root, test
# -ef and os.path.samefile on 200 pairs, cp between them).
#
# Usage: benches/identity/shared.sh OLD_FORKD NEW_FORKD   (as root; $FORKD_CACHE images)
set -u
old_bin="${1:?usage: shared.sh OLD_FORKD NEW_FORKD}"
new_bin="${2:?usage: shared.sh OLD_FORKD NEW_FORKD}"
check="$(cd "$(dirname "$0")/../.." && pwd)/fixtures/identity/check.sh"
cache="${FORKD_CACHE:-/var/cache/forkd}"
for which in old new; do
  bin=$new_bin; [ $which = old ] && bin=$old_bin
  dir=$(mktemp -d /var/tmp/idcmp.XXXX)
  FORKD_ROOT=$dir/root FORKD_SOCKET=$dir/sock FORKD_VOLUME_SIZE=16G $bin daemon > $dir/log 2>&1 &
  pid=$!
  until FORKD_SOCKET=$dir/sock $bin ps >/dev/null 2>&1; do sleep 0.2; done
  f() { FORKD_SOCKET=$dir/sock $bin "$@"; }
  f image import $cache/images/debian.tar.zst --name debian >/dev/null 2>&1
  id=$(f run -d debian -- sleep infinity)
  f exec $id -- sh -c 'i=0; while [ $i -lt 3000 ]; do mkdir -p /root/w/d$((i % 100)); echo $i > /root/w/d$((i % 100))/f$i; i=$((i+1)); done'
  f cp "$check" $id:/tmp/c.sh
  echo "$which sandbox: $(f exec $id -- sh /tmp/c.sh /root/w 200 2>/dev/null | tr '\n' ';')"
  ck=$(f checkpoint --live $id 2>/dev/null)
  b=$(f fork $ck)
  f exec $b -- sh -c 'i=0; while [ $i -lt 1000 ]; do mkdir -p /root/w2/d$((i % 50)); echo $i > /root/w2/d$((i % 50))/f$i; i=$((i+1)); done'
  f cp "$check" $b:/tmp/c.sh
  echo "$which branch: $(f exec $b -- sh /tmp/c.sh /root/w2 200 2>/dev/null | tr '\n' ';')"
  f rm -f $id $b >/dev/null; kill $pid; wait $pid; umount $dir/root/vol 2>/dev/null; rm -rf $dir
done
