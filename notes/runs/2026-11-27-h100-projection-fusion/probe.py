import torch,triton.testing as tt
S={'small':(768,3072),'medium':(1024,4096),'large':(1280,5120),'xl':(1600,6400),'2.7B':(2560,10240)}
M=2048
def t(f): return tt.do_bench(f,warmup=50,rep=300,return_mode='median')
for n,(d,ff) in S.items():
    x=torch.randn(M,d,device='cuda',dtype=torch.bfloat16); g3=torch.randn(M,3*d,device='cuda',dtype=torch.bfloat16)
    W=[torch.randn(d,d,device='cuda',dtype=torch.bfloat16) for _ in range(3)]; Wf=torch.cat(W)
    gs=[g3[:,i*d:(i+1)*d].contiguous() for i in range(3)]
    sep=lambda:[(x@w.T, g@w, g.T@x) for w,g in zip(W,gs)]
    fus=lambda:(x@Wf.T, g3@Wf, g3.T@x)
    h=torch.randn(M,2*ff,device='cuda',dtype=torch.bfloat16); V=[torch.randn(ff,d,device='cuda',dtype=torch.bfloat16) for _ in range(2)]; Vf=torch.cat(V)
    hs=[h[:,i*ff:(i+1)*ff].contiguous() for i in range(2)]
    sep2=lambda:[(x@w.T, g@w, g.T@x) for w,g in zip(V,hs)]
    fus2=lambda:(x@Vf.T, h@Vf, h.T@x)
    a,b,c,e=t(sep),t(fus),t(sep2),t(fus2)
    print(f"{n}: qkv fwd+bwd 3 GEMM sets {a*1e3:.0f} us, fused {b*1e3:.0f} us ({a/b:.2f}x); w1|w3 {c*1e3:.0f} us, fused {e*1e3:.0f} us ({c/e:.2f}x); per-layer saving {(a-b+c-e)*1e3:.0f} us",flush=True)
