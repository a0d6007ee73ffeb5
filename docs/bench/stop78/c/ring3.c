#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#define CAP (1<<20)
#define CHUNK (64<<10)
static void copy(const char*f, char*t, size_t len){ size_t at=0;
 for(;at+128<=len;at+=128){ __m256i a=_mm256_loadu_si256((void*)(f+at)),b=_mm256_loadu_si256((void*)(f+at+32)),c=_mm256_loadu_si256((void*)(f+at+64)),d=_mm256_loadu_si256((void*)(f+at+96));
 _mm256_storeu_si256((void*)(t+at),a);_mm256_storeu_si256((void*)(t+at+32),b);_mm256_storeu_si256((void*)(t+at+64),c);_mm256_storeu_si256((void*)(t+at+96),d);}
 for(;at<len;at++) t[at]=f[at]; }
static int NT;
static void copynt(const char*f, char*t, size_t len){ size_t at=0;
 for(;at+128<=len;at+=128){ __m256i a=_mm256_loadu_si256((void*)(f+at)),b=_mm256_loadu_si256((void*)(f+at+32)),c=_mm256_loadu_si256((void*)(f+at+64)),d=_mm256_loadu_si256((void*)(f+at+96));
 _mm256_stream_si256((void*)(t+at),a);_mm256_stream_si256((void*)(t+at+32),b);_mm256_stream_si256((void*)(t+at+64),c);_mm256_stream_si256((void*)(t+at+96),d);}
 for(;at<len;at++) t[at]=f[at]; _mm_sfence(); }
static double now(){struct timespec ts;clock_gettime(CLOCK_MONOTONIC,&ts);return ts.tv_sec+ts.tv_nsec*1e-9;}
static char*ring; static _Atomic unsigned long tail, head; static size_t MSG; static long NMSG; static char*rdst;
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static void*reader(void*x){ pin(1); unsigned long h=0; for(long m=0;m<NMSG;m++){ size_t done=0; while(done<MSG){ unsigned long t; while((t=atomic_load(&tail))==h) _mm_pause();
   size_t n=t-h; if(n>MSG-done)n=MSG-done; size_t off=h%CAP; if(n>CAP-off)n=CAP-off; copy(ring+off, rdst+done, n); done+=n; h+=n; atomic_store(&head,h);} } return 0;}
int main(int argc,char**argv){ int so=atoi(argv[1]); long hdr=atol(argv[2]); MSG=(1<<20)+hdr; NMSG=argc>3?atol(argv[3]):2000; NT=argc>4?atoi(argv[4]):0;
 ring=mmap(0,CAP,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS|MAP_POPULATE,-1,0);
 char*src=mmap(0,MSG+8192,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE,-1,0)+so;
 rdst=mmap(0,MSG+8192,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE,-1,0);
 memset(src,1,MSG); memset(rdst,0,MSG); pthread_t th; pthread_create(&th,0,reader,0); pin(0);
 unsigned long t=0; double t0=now(); for(long m=0;m<NMSG;m++){ size_t done=0; while(done<MSG){ size_t room; while((room=CAP-(t-atomic_load(&head)))==0) _mm_pause();
   size_t n=MSG-done; if(n>CHUNK)n=CHUNK; if(n>room)n=room; size_t off=t%CAP; if(n>CAP-off)n=CAP-off; if(NT) copynt(src+done, ring+off, n); else copy(src+done, ring+off, n); done+=n; t+=n; atomic_store(&tail,t);} }
 pthread_join(th,0); double dt=now()-t0; printf("nt=%d so=%4d hdr=%ld: %.1f GB/s\n",so,hdr,MSG*(double)NMSG/dt/1e9); }
