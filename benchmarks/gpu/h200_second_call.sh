set -o pipefail; export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
b() { local t=$1 name=$2; shift 2
  timeout "$t" python3 -m fedjax_inv.cli bench "$@" --rounds 3 --max-impl-s 20 --no-matmul-peak --json "$OUT/$name.json" 2>&1 | tee -a "$OUT/gpu2.log" | grep -v "^ " ; }
b 70 cnn_auto --workloads cnn --clients 100,1000 --impls loop,auto,vmap
for k in 16 32 128 250; do b 35 cnn_chunk$k --workloads cnn --clients 1000 --impls chunked --chunk-size $k; done
b 110 heavy2 --workloads mlp_fediir,cnn_fedsr --clients 10,100,1000 --impls loop,auto,vmap,scan,chunked
