import sys, time, statistics, cProfile, pstats
sys.argv=["x"]
from common import setup_django, bench_user
setup_django()
from django.test import Client
from rest_framework.authtoken.models import Token
u=bench_user(); token=Token.objects.get_or_create(user=u)[0].key
c=Client(HTTP_AUTHORIZATION=f"Token {token}")
for path in ["/api/agents/agents"]:
    for i in range(20): c.get(path)
    xs=[]
    for i in range(300):
        a=time.perf_counter(); r=c.get(path); xs.append(time.perf_counter()-a)
    print(path, r.status_code, "%.2f ms" % (statistics.median(xs)*1000))
xs=[]
for i in range(300):
    a=time.perf_counter(); r=c.post("/api/agents/tasks", {"agentId":"echo","input":"x"}, content_type="application/json"); xs.append(time.perf_counter()-a)
print("POST /tasks", r.status_code, "%.2f ms" % (statistics.median(xs)*1000))
pr=cProfile.Profile(); pr.enable()
for i in range(200): c.post("/api/agents/tasks", {"agentId":"echo","input":"x"}, content_type="application/json")
pr.disable(); pstats.Stats(pr).sort_stats("cumulative").print_stats(40)
