import time, torch, splitkv
from splitkv import _calls, workspace as wm
torch.manual_seed(0)
q=torch.randn(1,4,64); kv=torch.randn(4,2,4,16,64)
bt=torch.arange(4,dtype=torch.int32).view(1,4); sl=torch.tensor([16],dtype=torch.int32)
ws=splitkv.Workspace(16<<20); out=torch.empty_like(q)
for _ in range(10): splitkv.paged_attention(q,kv,bt,sl,ws,out=out)
def t(name,f,n=20000):
    for _ in range(1000): f()
    best=1e9
    for r in range(5):
        t0=time.perf_counter_ns()
        for _ in range(n): f()
        best=min(best,(time.perf_counter_ns()-t0)/n/1000)
    print(f"{name:40s} {best:6.2f} us")
args=(q,kv,bt,sl,ws,None,"HND",None,True,-1,0.0,None,False,out,None,False,None,None,None,None,None)
t("paged_attention(out=)", lambda: splitkv.paged_attention(q,kv,bt,sl,ws,out=out))
t("_paged_lookup", lambda: _calls._paged_lookup(*args))
view,key,layout=_calls._paged_lookup(*args)
t("workspace_view", lambda: _calls.workspace_view(ws))
t("_paged_key", lambda: _calls._paged_key(q,kv,bt,sl,view[1],None,out,_calls._option_key("HND",None,True,-1,0.0,None,False,None,False),None))
t("dict get", lambda: _calls._layouts.get(key))
t("launch_paged_layout", lambda: _calls.launch_paged_layout("paged_attention",layout,view,q,kv,bt,sl,ws,None,False,out,None,None,None,None,None))
addresses=(q.data_ptr(),kv.data_ptr(),kv.data_ptr()+layout.v_offset,0,bt.data_ptr(),sl.data_ptr(),0,0,0,out.data_ptr(),0)
t("launch_layout", lambda: _calls.launch_layout("paged_attention",layout,addresses,ws,view,1,None,None))
buffer,_,cw,busy,order,_=view
t("layout.launch only", lambda: layout.launch(*addresses,cw,0,-1,1,0,0,None))
t("acquire+release", lambda: (wm.acquire("x",busy), wm.release(busy)))
t("written(out)", lambda: _calls.written(out))
t("6x data_ptr", lambda: (q.data_ptr(),kv.data_ptr(),bt.data_ptr(),sl.data_ptr(),out.data_ptr(),q.data_ptr()))
t("q.shape,stride,dtype,device,is_neg", lambda: (q.shape,q.stride(),q.dtype,q.device,q.is_neg()))
t("out_key", lambda: _calls.out_key(out))
t("torch.empty_like(q)", lambda: torch.empty_like(q))
t("is_compiling", lambda: torch.compiler.is_compiling())
t("paged_call direct", lambda: _calls.paged_call(*(("paged_attention",)+args)))
import torch._dynamo
t("torch._dynamo.is_compiling", lambda: torch._dynamo.is_compiling())

