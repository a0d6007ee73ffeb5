#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void cp_avx(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=128){__m256i a=_mm256_loadu_si256((void*)(s+i)),b=_mm256_loadu_si256((void*)(s+i+32)),c=_mm256_loadu_si256((void*)(s+i+64)),e=_mm256_loadu_si256((void*)(s+i+96));_mm256_storeu_si256((void*)(d+i),a);_mm256_storeu_si256((void*)(d+i+32),b);_mm256_storeu_si256((void*)(d+i+64),c);_mm256_storeu_si256((void*)(d+i+96),e);}}
static void cp_nt(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=128){__m256i a=_mm256_loadu_si256((void*)(s+i)),b=_mm256_loadu_si256((void*)(s+i+32)),c=_mm256_loadu_si256((void*)(s+i+64)),e=_mm256_loadu_si256((void*)(s+i+96));_mm256_stream_si256((void*)(d+i),a);_mm256_stream_si256((void*)(d+i+32),b);_mm256_stream_si256((void*)(d+i+64),c);_mm256_stream_si256((void*)(d+i+96),e);}_mm_sfence();}
int main(int argc,char**argv){size_t n=(size_t)atoi(argv[1])<<20;int nd=atoi(argv[2]);
 int fd=memfd_create("a",0);ftruncate(fd,n);char*src=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);memset(src,1,n);
 char*rsrc=mmap(0,n,PROT_READ,MAP_SHARED,fd,0);
 char*heap=aligned_alloc(4096,n);memset(heap,1,n);
 char**d=malloc(nd*sizeof(char*));for(int i=0;i<nd;i++){d[i]=aligned_alloc(4096,n);memset(d[i],0,n);}
 const char*names[]={"memcpy heap->d","avx shm->d","nt shm->d","memcpy shm->d","avx heap->d"};
 for(int m=0;m<5;m++){int it=0;double t0=now();while(now()-t0<1.0){char*dd=d[it%nd];const char*s=(m==0||m==4)?heap:rsrc;if(m==0||m==3)memcpy(dd,s,n);else if(m==1||m==4)cp_avx(dd,s,n);else cp_nt(dd,s,n);it++;}double t=now()-t0;printf("%-16s %5.2f GB/s\n",names[m],it*(double)n/t/1e9);}
}
